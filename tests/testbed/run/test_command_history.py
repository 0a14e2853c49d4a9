"""A command workload's own history, judged by the testbed (privileged, real namespaces).

Two plain programs (no testbed imports) write ``$TESTBED_HISTORY``: the owner on ``a0``
commits two versions of ``k``; ``a1`` acts once on a plan derived from the first version
after the second was committed (stale), once on a plan from the second (current). The
episode row's checker columns and ``testbed history check`` say so; a program whose
history breaks the format aborts the episode with the line named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

PROGRAM = """
import json, os, sys, time
me, t0 = os.environ["TESTBED_HOST"], int(os.environ["TESTBED_T0_NS"])
out = open(os.environ["TESTBED_HISTORY"], "w")

def emit(event):
    out.write(json.dumps(event) + "\\n")
    out.flush()

def at(ms):  # after the lead (1 s), 0.5 s apart: wide margins for a late start
    wait = t0 / 1e9 + ms / 1e3 - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    return time.monotonic_ns()

emit({"history": 1, "host": sys.argv[1] if len(sys.argv) > 1 else me})
if me == "a0":
    emit({"type": "write", "t_ns": at(1500), "key": "k", "version": "v1", "owner": me})
    emit({"type": "write", "t_ns": at(2500), "key": "k", "version": "v2", "owner": me})
else:
    emit({"type": "derive", "t_ns": at(2000), "plan": "p1", "inputs": {"k": "v1"}})
    emit({"type": "act", "t_ns": at(3000), "action": "stale-one", "plan": "p1"})
    emit({"type": "derive", "t_ns": at(3500), "plan": "p2", "inputs": {"k": "v2"}})
    emit({"type": "act", "t_ns": at(3600), "action": "current-one", "plan": "p2"})
"""
CAMPAIGN = """
name = "own-history"
seed = 5
templates = 1
kind = "command"

[options]
episode_timeout_s = 60

[command]
timeout_s = 30
lead_ms = 1000

[[command.run]]
on = "agents"
argv = ["python3", "program.py"{extra}]

[grid]
network = ["fixed"]
policy = ["mine"]
agents = [2]
keys = [2]
units = [4]
rho = [1]
"""


def _setup(tmp_path: Path, extra: str = "") -> Path:
    if os.geteuid() != 0 or not os.path.exists("/dev/net/tun"):
        pytest.skip("needs root and /dev/net/tun for network namespaces")
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "c.toml").write_text(CAMPAIGN.replace("{extra}", extra))
    return tmp_path


def _testbed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, check=False)


def test_the_testbed_judges_a_programs_history(tmp_path: Path) -> None:
    cwd = _setup(tmp_path)
    out = cwd / "out"
    proc = _testbed("run", "c.toml", "--out", str(out), cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (episode,) = pd.read_parquet(out / "episodes.parquet").to_dict("records")
    assert not episode["aborted"], episode["abort_reason"]
    assert episode["stale_actions"] == 1
    assert episode["fresh_memory_stale_plan"] == 0  # a1 never held v2
    assert 0 < episode["stale_late_max_ms"] < 3000  # written at 2.5 s, act at 3 s
    check = _testbed("history", "check", str(out), cwd=cwd)
    assert check.returncode == 1, check.stderr
    assert "stale action 'stale-one' by a1" in check.stdout
    assert "current-one" not in check.stdout
    (anomaly,) = [json.loads(line) for line in
                  (out / "history" / "anomalies.jsonl").read_text().splitlines()]
    assert anomaly["inputs"][0]["used"] == "v1"
    assert anomaly["inputs"][0]["newer"] == "v2"
    assert anomaly["inputs"][0]["newer_by"] == "a0"


def test_a_history_naming_another_host_aborts_the_episode(tmp_path: Path) -> None:
    cwd = _setup(tmp_path, extra=', "zz"')
    out = cwd / "out"
    proc = _testbed("run", "c.toml", "--out", str(out), cwd=cwd)
    assert proc.returncode == 5, proc.stderr[-3000:]  # every episode aborted
    (episode,) = pd.read_parquet(out / "episodes.parquet").to_dict("records")
    assert episode["aborted"]
    assert "history: " in episode["abort_reason"]
    assert "a0.history.jsonl:1: header host 'zz', but the program runs on 'a0'" in \
        episode["abort_reason"]
