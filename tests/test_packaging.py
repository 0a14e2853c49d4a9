"""Packaging as users install it: the package list, the lock, and a real wheel install.

The wheel test builds the project's wheel, installs it (not editable) into an empty
virtualenv from the lock, and uses the installed ``testbed`` from a directory outside
the checkout: it must list the shipped traces and run a campaign (a ``fixed`` link as
root, loopback otherwise).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_dirs() -> set[str]:
    found = set()
    for pkg in ("protocols", "nodes", "testbed"):
        for init in (ROOT / pkg).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_package_is_listed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert listed - {"testbed.traces"} == _package_dirs()
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"testbed.traces": "traces"}


def test_license_uses_the_spdx_form() -> None:
    assert PYPROJECT["project"]["license"] == "MIT"


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_the_lock_pins_every_dependency() -> None:
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not pinned with =="
            lock[name.lower().replace("_", "-")] = version
    wanted = [*PYPROJECT["project"]["dependencies"],
              *PYPROJECT["project"]["optional-dependencies"]["dev"]]
    missing = [w for w in wanted if _requirement_name(w) not in lock]
    assert not missing, f"requirements.lock lacks {missing}; regenerate it"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a wheel, a venv, every dependency from the index and a run
def test_wheel_installs_into_an_empty_venv_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("planfence_testbed-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c",
                    str(ROOT / "requirements.lock"), str(wheel)],
                   check=True, capture_output=True, timeout=900)
    outside = tmp_path / "work"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TESTBED_TRACE_DIR")}
    testbed = str(venv / "bin" / "testbed")

    def run(*args: str) -> str:
        proc = subprocess.run([testbed, *args], cwd=outside, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert run("--version").strip().startswith("testbed ")
    listing = run("traces", "list")
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "from testbed.links.traces import trace_dir; print(trace_dir())"],
                           cwd=outside, env=env, capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip()
    assert where == str(next((venv / "lib").glob("python3*")) / "site-packages" / "testbed"
                        / "traces")
    shipped = sorted(p.name for p in (ROOT / "traces").iterdir()
                     if p.suffix in (".up", ".down"))
    for name in shipped:
        assert name in listing
    network = "fixed" if os.geteuid() == 0 and os.path.exists("/dev/net/tun") else "loopback"
    (outside / "tiny.toml").write_text(
        'name = "tiny"\nseed = 3\ntemplates = 1\n[options]\nepisode_timeout_s = 120\n'
        f'[grid]\npolicy = ["planfence"]\nnetwork = ["{network}"]\nagents = [2]\n'
        'keys = [2]\nunits = [8]\nconnection = ["reuse"]\n')
    run("run", "tiny.toml", "--out", "out")
    assert (outside / "out" / "episodes.parquet").is_file()
    assert "invalid/issued" in run("report", "out") or (outside / "out" / "report.md").is_file()
