"""Rootless runs: an unprivileged user runs a shaped campaign inside a user namespace.

The test installs the testbed's wheel into a virtualenv the unprivileged user can read
(built from a world-readable interpreter), then runs a ``fixed`` 20 ms two-agent
campaign as ``nobody`` and checks the same physics as the root tests: a released
PlanFence action asks its owner across four link crossings, so it stalls >= 80 ms.
Where only root may open /dev/net/tun (a 0600 node), the user gets a 0666 node in a
private mount namespace first, as an administrator would give it; the test skips, with
the probe's reason, only where unprivileged user namespaces are not available.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from testbed.host.userns import probe
from tests.privileges import NOBODY, TUN_0666

ROOT = Path(__file__).resolve().parents[3]
WRAP_TOOLS = ("unshare", "mount", "mknod", "setpriv")


def _world_python() -> str | None:
    """An interpreter (>= 3.11) that uid 65534 may execute."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = shutil.which(candidate) or candidate
        if not os.path.exists(path):
            continue
        try:
            check = subprocess.run([path, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                                   user=NOBODY, group=NOBODY, extra_groups=[],
                                   capture_output=True, timeout=60, check=False)
        except PermissionError:  # an interpreter under a directory only root may enter
            continue
        if check.returncode == 0:
            return path
    return None


def _as_nobody_env(home: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A scratch directory the unprivileged user can reach (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="tb-rootless-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.privileged
def test_a_fixed_link_campaign_runs_rootless(shared_dir: Path) -> None:
    tmp_path = shared_dir
    if os.geteuid() != 0:
        pytest.skip("needs root to prepare an environment for the unprivileged user")
    works, detail = probe()
    # a host whose /dev/net/tun only root may open (this one: 0600; Debian's is 0666)
    # gets the user a 0666 node in a private mount namespace (TUN_0666); the host's own
    # node is untouched
    wrap = not works and "/dev/net/tun" in detail and "EACCES" in detail
    if not works and not (wrap and all(shutil.which(t) for t in WRAP_TOOLS)):
        pytest.skip(f"unprivileged user namespaces cannot run topologies here: {detail}")
    python = _world_python()
    if python is None:
        pytest.skip("no Python >= 3.11 that an unprivileged user may execute")
    dist, venv, home = tmp_path / "dist", tmp_path / "venv", tmp_path / "home"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c",
                    str(ROOT / "requirements.lock"), str(next(dist.glob("*.whl")))],
                   check=True, capture_output=True, timeout=900)
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    (home / "c.toml").write_text(
        'name = "rootless"\nseed = 5\ntemplates = 3\n[options]\nepisode_timeout_s = 120\n'
        '[grid]\npolicy = ["planfence"]\nnetwork = ["fixed"]\nagents = [2]\nkeys = [4]\n'
        'units = [16]\nconnection = ["reuse"]\n')
    command = [str(venv / "bin" / "testbed"), "run", "c.toml", "--out", "out"]
    if wrap:
        env = [f"{k}={v}" for k, v in _as_nobody_env(home).items()]
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               TUN_0666, "sh", "env", "-i", *env, *command],
                              cwd=home, capture_output=True, text=True, timeout=600,
                              check=False)
    else:
        proc = subprocess.run(command, cwd=home, env=_as_nobody_env(home), user=NOBODY,
                              group=NOBODY, extra_groups=[], capture_output=True, text=True,
                              timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = home / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["system"]["privilege"] == "userns"
    group = next(iter(manifest["groups"].values()))
    assert group["privilege"] == "userns"
    assert group["congestion_control_set_by"] == "socket"
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    actions = pd.read_parquet(out / "actions.parquet")
    released = actions[actions["outcome"] == "released"]
    asked = released[released["bytes"] > 0]  # an owner query crossed the links
    assert len(asked) > 0, actions[["action", "executor", "bytes", "stall_ms"]].to_string()
    # physics: four 20 ms crossings per owner query; the margin absorbs a loaded host
    assert (asked["stall_ms"] >= 80.0).all(), asked["stall_ms"].tolist()
    assert (asked["stall_ms"] < 1000.0).all(), asked["stall_ms"].tolist()
