"""A killed controller's topologies are removed by ``--resume`` and ``testbed clean``
whatever their ledgers' labels, and nothing of a live run is touched (issue 20).

Real processes own real ledgers with real namespaces; the controllers are killed with
SIGKILL. ``clean_dead_runs`` is what both ``testbed clean`` and ``testbed run --resume``
call (testbed/cli/maintenance.py, testbed/cli/campaigns.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.host import kernel, processes
from testbed.host import ledger as ledger_mod

pytestmark = pytest.mark.privileged

if os.geteuid() != 0:
    pytest.skip("needs root for network namespaces", allow_module_level=True)

#: A controller's ledgers as a run makes them: the run ledger labelled with its results
#: directory (a temporary directory), a topology's ledger without a label (a namespace),
#: then it waits to be killed.
CONTROLLER = """
import json, sys, time
from pathlib import Path
from testbed.host import kernel
from testbed.host.ledger import Ledger, new_prefix
state_dir, out = Path(sys.argv[1]), sys.argv[2]
run = Ledger(new_prefix(), state_dir=state_dir, label=out)
run._save()
workdir = run.new_tmpdir("planfence", state_dir.parent)
topo = Ledger(new_prefix(), state_dir=state_dir)
netns = f"{topo.prefix}-a0"
topo.record_netns(netns)
kernel.create_netns(netns)
print(json.dumps({"workdir": str(workdir), "netns": netns,
                  "ledgers": [run.prefix, topo.prefix]}), flush=True)
time.sleep(120)
"""


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "state"
    path.mkdir()
    yield path
    for ledger_path in path.glob("tb*.json"):  # whatever a failed test left
        ledger = ledger_mod.Ledger.load(ledger_path)
        ledger.teardown()


def _controller(state_dir: Path, out: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    child = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(state_dir), out],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    made = json.loads(child.stdout.readline())
    return child, made


def test_resume_removes_a_killed_controllers_unlabelled_topology(state_dir: Path) -> None:
    killed, made = _controller(state_dir, "/results/killed")
    live, live_made = _controller(state_dir, "/results/live")  # another run, still going
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        labels = {ledger_mod.Ledger.load(p).label for p in state_dir.glob("tb*.json")}
        assert labels == {"/results/killed", "/results/live", ""}
        removed = ledger_mod.clean_dead_runs(state_dir)
        assert f"netns {made['netns']}" in removed
        assert made["netns"] not in kernel.list_netns()
        assert not Path(str(made["workdir"])).exists()
        left = {p.stem for p in state_dir.glob("tb*.json")}
        assert left == set(live_made["ledgers"])  # type: ignore[arg-type]
        assert live_made["netns"] in kernel.list_netns()  # the live run keeps its own
        assert Path(str(live_made["workdir"])).exists()
    finally:
        live.kill()
        live.wait()
    assert ledger_mod.clean_dead_runs(state_dir)  # now the other run is dead too
    assert live_made["netns"] not in kernel.list_netns()


def test_an_unreaped_killed_controller_is_dead(state_dir: Path) -> None:
    """A controller killed but not yet reaped by its parent (a zombie, as under a
    parent that waits late) is a dead run: its leftovers go."""
    killed, made = _controller(state_dir, "/results/zombie")
    try:
        os.kill(killed.pid, signal.SIGKILL)
        while processes.is_running(killed.pid, None):  # until it is a zombie
            time.sleep(0.01)
        assert processes.process_start_ticks(killed.pid) is not None  # not reaped yet
        ledger_mod.clean_dead_runs(state_dir)
        assert made["netns"] not in kernel.list_netns()
        assert not list(state_dir.glob("tb*.json"))
    finally:
        killed.wait()


def test_a_reused_owner_pid_is_a_dead_run_and_its_process_is_not_killed(
        state_dir: Path) -> None:
    """The owner's pid now belongs to another process (a different start time): the
    ledger is a dead run's and is undone, but that process is not stopped."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = ledger_mod.Ledger(ledger_mod.new_prefix(), owner_pid=sleeper.pid,
                                   owner_start_ticks=1, state_dir=state_dir)
        netns = f"{orphan.prefix}-a0"
        orphan.record_netns(netns)
        kernel.create_netns(netns)
        orphan.entries.append({"kind": "process", "pid": sleeper.pid, "start_ticks": 1})
        orphan._save()
        assert ledger_mod.clean_dead_runs(state_dir) == [f"netns {netns}"]
        assert sleeper.poll() is None
        assert netns not in kernel.list_netns()
    finally:
        sleeper.kill()
        sleeper.wait()
