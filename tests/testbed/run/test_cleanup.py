"""No temporary directory outlives a killed run (issue 11, "Leftovers").

``testbed run`` is started as a child process on loopback, killed with SIGKILL while
its nodes hold stores and logs under ``--workdir`` and sockets under the temp root;
then ``testbed clean`` (or ``--resume`` of the same directory) must leave none of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed.host.ledger import run_state_dir

pytestmark = pytest.mark.slow

CAMPAIGN = """
name = "leftovers"
seed = 4
templates = 6

[options]
episode_timeout_s = 60

[grid]
policy = ["planfence", "owner_head_freshness"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["fresh"]
units = [16]
"""


def _testbed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, check=False)


def _leftovers(workdir: Path, prefixes: set[str]) -> list[Path]:
    tmp = Path(tempfile.gettempdir())
    found = list(workdir.glob("planfence-*"))
    for prefix in prefixes:
        found += list(tmp.glob(f"pft-ctl-{prefix}-*"))
    return found


def _run_prefixes(out: Path) -> set[str]:
    prefixes = set()
    for path in run_state_dir().glob("tb*.json"):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if body.get("label") == str(out.absolute()):
            prefixes.add(str(body["prefix"]))
    return prefixes


def _start_and_kill(tmp_path: Path) -> tuple[Path, Path, set[str]]:
    (tmp_path / "c.toml").write_text(CAMPAIGN)
    out, workdir = tmp_path / "out", tmp_path / "work"
    workdir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "c.toml", "--out",
                             str(out), "--workdir", str(workdir)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(workdir.glob("planfence-*/stores/*.sqlite")):
            assert proc.poll() is None, "testbed run ended before it made its stores"
            assert time.monotonic() < deadline, "no store appeared"
            time.sleep(0.05)
        prefixes = _run_prefixes(out)
        time.sleep(0.3)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _leftovers(workdir, prefixes), "nothing to clean: the test would prove nothing"
    return out, workdir, prefixes


@pytest.mark.skipif(os.geteuid() != 0, reason="testbed clean needs root")
def test_kill_9_then_clean_leaves_no_temporary_directory(tmp_path: Path) -> None:
    out, workdir, prefixes = _start_and_kill(tmp_path)
    proc = _testbed("clean", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _leftovers(workdir, prefixes) == []
    assert _run_prefixes(out) == set()


def test_kill_9_then_resume_leaves_no_temporary_directory(tmp_path: Path) -> None:
    out, workdir, prefixes = _start_and_kill(tmp_path)
    proc = _testbed("run", "c.toml", "--out", str(out), "--workdir", str(workdir),
                    "--resume", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _leftovers(workdir, prefixes) == []
    assert _run_prefixes(out) == set()  # the resumed run's own ledger is gone too
