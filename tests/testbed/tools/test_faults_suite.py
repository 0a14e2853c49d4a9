"""`testbed faults` end to end: every fault kind, a few trials each, as a user runs it.

The full run and its table are in docs/reliability.md; this keeps the suite itself
working: each kind ends as it must and proves what it must (testbed/tools/
fault_checks.py: nothing lost, duplicated, wrongly judged or left behind; a freeze just
longer than the heartbeat timeout aborts; floods stay within the node's byte caps and
their memory is given back; a killed controller's namespaces are gone after
``--resume`` or ``clean``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.tools.faults import KINDS


@pytest.mark.slow
@pytest.mark.privileged
@pytest.mark.timeout(960)  # fourteen kinds, two trials each: about 5 minutes, more when loaded
def test_every_fault_kind_ends_as_it_must(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not Path("/dev/net/tun").exists():
        pytest.skip("testbed faults needs root and TUN devices")
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, "-m", "testbed", "faults", "--trials", "2",
                           "--seed", "3", "--json", str(out)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=930, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["kind"]: r for r in json.loads(out.read_text())}
    assert set(rows) == set(KINDS)
    for r in rows.values():
        assert (r["lost"], r["duplicated"], r["wrongly_judged"]) == (0, 0, 0), r
        assert (r["processes_left"], r["namespaces_left"], r["files_left"]) == (0, 0, 0), r
        assert r["aborted_right_reason"] == r["aborted"], r  # every abort for its reason
    for kind in ("node_kill", "node_stop", "node_freeze", "disk_full"):
        assert rows[kind]["aborted"] == rows[kind]["trials"], rows[kind]
    for kind in ("duplicate", "reorder"):
        assert rows[kind]["completed"] == rows[kind]["trials"], rows[kind]  # TCP recovers
    for kind in ("controller_kill", "controller_kill_shaped"):
        assert rows[kind]["completed"] == 2 * 4  # every episode, exactly once
    for kind in ("unread_flood", "preauth_flood"):
        assert rows[kind]["attacks_closed"] == rows[kind]["trials"], rows[kind]
        assert rows[kind]["victim_after_mib"] <= 64, rows[kind]
    assert all(r["proved"] for r in rows.values()), \
        {k: r["failed"] for k, r in rows.items() if r["failed"]}
