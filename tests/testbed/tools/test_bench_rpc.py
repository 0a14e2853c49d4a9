"""`testbed bench rpc` pins the raw echo and the RPC pair alike (testbed/tools/placement.py).

The harness-floor ratio compares a node's head query with a raw TCP echo; both are
round trips between two processes, whose cost depends on whether the two share a CPU.
Each ratio must divide figures measured in one placement: the CPUs each end was allowed
are read back from the kernel during the measurement, not taken from the plan. The bench
runs as its own process (`python -m testbed.tools.bench_rpc`): it loads a policy plugin
(`bench_policy`) into the registry, which must not leak into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.tools import placement

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def test_pinned_covers_every_thread_and_is_undone() -> None:
    child = subprocess.Popen([sys.executable, "-c", (
        "import threading, time, sys\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) == 2
        before = os.sched_getaffinity(child.pid)
        cpu = max(before)
        with placement.pinned(child.pid, {cpu}):
            for tid in tasks:
                assert os.sched_getaffinity(int(tid)) == {cpu}
            assert placement.cpus_allowed_list(child.pid) == str(cpu)
        for tid in tasks:
            assert os.sched_getaffinity(int(tid)) == before
    finally:
        child.kill()
        child.wait()


def test_plan() -> None:
    assert placement.plan("same_cpu", {0, 1, 3}) == (3, 3)
    assert placement.plan("cross_cpu", {0, 1, 3}) == (1, 3)
    assert placement.plan("cross_cpu", {2}) is None
    with pytest.raises(ValueError, match="placement"):
        placement.plan("numa", {0})


@pytest.mark.slow
def test_each_ratio_compares_one_placement(tmp_path: Path) -> None:
    out = tmp_path / "rpc.json"
    proc = subprocess.run([sys.executable, "-m", "testbed.tools.bench_rpc", "--calls", "100",
                           "--json", str(out)], capture_output=True, text=True, timeout=280,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    wanted = placement.PLACEMENTS if TWO_CPUS else ("same_cpu",)
    assert figures["not_measured"] == [p for p in placement.PLACEMENTS if p not in wanted]
    for name in wanted:
        placed = figures[name]
        for pair in ("raw_echo", "rpc"):
            cpus = placed["cpus"][pair]
            assert len(cpus["client"]) == 1, (name, pair, cpus)
            same = cpus["client"] == cpus["server"]
            assert same == (name == "same_cpu"), (name, pair, cpus)
        # both pairs were placed alike
        assert placed["cpus"]["raw_echo"] == placed["cpus"]["rpc"]
        ratio = placed["reuse_p50_ms"] / placed["raw_echo_p50_ms"]
        assert placed["reuse_vs_raw"] == pytest.approx(ratio, rel=0.02)
        ratio = placed["fresh_p50_ms"] / placed["raw_echo_p50_ms"]
        assert placed["fresh_vs_raw"] == pytest.approx(ratio, rel=0.02)
    assert "reuse_vs_raw" not in figures  # no ratio across placements
