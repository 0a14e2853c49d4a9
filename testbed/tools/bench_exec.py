"""``testbed bench exec``: how long ``testbed exec`` takes to start a command, and to
remove everything once it has exited.

For each network size (2 and 8 hosts of ``fixed``, an emulated link without a trace) the
benchmark runs ``testbed exec fixed --hosts N -- bash -c ...`` as a user would (a child
process, bytecode caches allowed as in a normal installation) several times. The command
writes bash's ``$EPOCHREALTIME`` on entry and right before it exits, on every host:

- start: from the spawn of ``testbed exec`` to the first instruction of the command on
  the last host to start (every host has started);
- removal: from the last host's exit to the exit of ``testbed exec``, which returns only
  after the topology, its processes and its directory are removed.

The CPU time of ``testbed exec`` and every process it started (user + system), and the
controller's own CPU time up to the end of its imports and of the build, are recorded
too: unlike the wall times they do not grow with the host's load.
``testbed exec`` writes its phases (``TESTBED_EXEC_TIMINGS``, ``testbed.tools.user_exec``
rule 5), so each figure splits into: interpreter start and imports, building the
network, starting the commands; waiting for them, removing. After every run the
benchmark checks that the run left nothing (namespaces, links, ledger).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from testbed.host import kernel
from testbed.host.ledger import STATE_DIR

HOSTS = (2, 8)
REPEATS = 5
TARGETS_S = {"start": 1.0, "removal": 2.0}
COMMAND = ('printf %s "$EPOCHREALTIME" > "start-$TESTBED_HOST"; '
           'printf %s "$EPOCHREALTIME" > "end-$TESTBED_HOST"')


def _stamp_ns(path: Path) -> int:
    seconds, _, fraction = path.read_text().strip().partition(".")
    return int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9])


def _leftovers(prefix: str) -> list[str]:
    found = [n for n in kernel.list_netns() if n.startswith(prefix)]
    found += [n for n in kernel.list_links() if n.startswith(prefix)]
    if (STATE_DIR / f"{prefix}.json").exists():
        found.append("ledger")
    return found


def one_run(hosts: int, scratch: Path) -> dict[str, Any]:
    """One ``testbed exec`` on HOSTS hosts; times in seconds."""
    for old in scratch.iterdir():
        old.unlink()
    timings = scratch / "timings.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TESTBED_EXEC_TIMINGS"] = str(timings)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time_ns()
    proc = subprocess.run([sys.executable, "-m", "testbed", "exec", "fixed", "--hosts",
                           str(hosts), "--quiet", "--", "bash", "-c", COMMAND],
                          cwd=scratch, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    exited = time.time_ns()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"testbed exec failed ({proc.returncode}): {proc.stderr[-2000:]}")
    starts = [_stamp_ns(scratch / f"start-a{i}") for i in range(hosts)]
    ends = [_stamp_ns(scratch / f"end-a{i}") for i in range(hosts)]
    phases = json.loads(timings.read_text())
    left = _leftovers(str(phases["prefix"]))
    if left:
        raise RuntimeError(f"testbed exec left {left} behind")

    def s(a: int, b: int) -> float:
        return (b - a) / 1e9

    return {
        "hosts": hosts,
        "start_s": s(spawned, max(starts)),
        "first_start_s": s(spawned, min(starts)),
        "removal_s": s(max(ends), exited),
        "imports_s": s(spawned, phases["main"]),
        "build_s": s(phases["main"], phases["network_built"]),
        "launch_s": s(phases["commands_starting"], max(starts)),
        "teardown_s": s(phases["commands_ended"], phases["removed"]),
        "exit_s": s(phases["removed"], exited),
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "imports_cpu_s": phases["main_cpu"],
        "build_cpu_s": phases["network_built_cpu"] - phases["main_cpu"],
        "left_behind": left,
    }


def bench_exec(json_path: Path | None, console: Console, *, repeats: int = REPEATS,
               hosts: tuple[int, ...] = HOSTS) -> dict[str, Any]:
    """Module docstring; returns (and writes to JSON_PATH) the runs and their medians."""
    load = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tb-bench-exec-") as tmp:
        scratch = Path(tmp)
        one_run(2, scratch)  # warm-up: bytecode caches, page cache
        for n in hosts:
            for _ in range(repeats):
                runs.append(one_run(n, scratch))
    keys = ("start_s", "first_start_s", "removal_s", "imports_s", "build_s", "launch_s",
            "teardown_s", "exit_s", "cpu_s", "imports_cpu_s", "build_cpu_s")
    summary = {}
    for n in hosts:
        mine = [r for r in runs if r["hosts"] == n]
        summary[str(n)] = {k: {"median": statistics.median(r[k] for r in mine),
                               "max": max(r[k] for r in mine)} for k in keys}
    result = {"network": "fixed", "repeats": repeats, "targets_s": TARGETS_S,
              "loadavg_before": load, "loadavg_after": os.getloadavg(), "runs": runs,
              "summary": summary}
    table = Table(title="testbed exec: start and removal (seconds, median / max of "
                        f"{repeats}; load {load[0]:.1f})")
    for column in ("hosts", "start", "removal", "imports", "build", "launch", "teardown",
                   "exit", "CPU", "imports CPU", "build CPU"):
        table.add_column(column, justify="right")
    for n in hosts:
        row = summary[str(n)]
        table.add_row(str(n), *(f"{row[k]['median']:.2f} / {row[k]['max']:.2f}"
                                for k in keys if k != "first_start_s"))
    console.print(table)
    console.print(f"targets: start < {TARGETS_S['start']:g} s, removal < "
                  f"{TARGETS_S['removal']:g} s; start = imports + build + launch (+ the "
                  "session's bookkeeping), removal = teardown + exit")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    return result
