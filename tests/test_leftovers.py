"""tests/leftovers.py counts only what the test's own runs created: a run of this process
left behind is found, a run of another process beside it never is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.host import kernel
from testbed.host.ledger import Ledger, new_prefix
from tests.leftovers import watch_runs

FOREIGN = """
import os, sys, time
from testbed.host import kernel
from testbed.host.ledger import Ledger
parent = os.getpid()
if os.fork():
    os._exit(0)  # the grandchild is reparented: no descendant of the test
while os.getppid() == parent:  # not yet: on a busy host the exit can come after our ledger
    time.sleep(0.01)
os.setsid()
ledger = Ledger(sys.argv[1])
ledger.record_netns(sys.argv[1] + "-x")
kernel.create_netns(sys.argv[1] + "-x")
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(60)
"""


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")


def test_a_run_of_this_process_that_is_left_behind_is_found(tmp_path: Path) -> None:
    _root()
    prefix = new_prefix()
    with watch_runs() as runs:
        ledger = Ledger(prefix)
        ledger.record_netns(f"{prefix}-a")
        kernel.create_netns(f"{prefix}-a")
        directory = ledger.new_tmpdir("planfence", tmp_path)
    try:
        assert runs.prefixes == {prefix}
        assert runs.leftovers() == {f"netns {prefix}-a", f"ledger {prefix}.json",
                                    f"directory {directory}"}
    finally:
        ledger.teardown()
    assert runs.leftovers() == set()


def test_a_run_of_another_process_beside_is_never_counted(tmp_path: Path) -> None:
    _root()
    prefix = new_prefix()
    pid_file = tmp_path / "pid"
    with watch_runs() as runs:
        subprocess.run([sys.executable, "-c", FOREIGN, prefix, str(pid_file)], check=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the foreign run did not start"
            time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        assert f"{prefix}-x" in kernel.list_netns()  # it is there, beside us
        assert prefix in runs.foreign
        assert runs.prefixes == set()
        assert runs.leftovers() == set()
    finally:
        os.kill(pid, 9)
        Ledger.load(Ledger(prefix).path).teardown()
