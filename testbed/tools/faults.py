"""``testbed faults``: the fault suite (docs/reliability.md).

Each fault kind runs ``trials`` short episodes (3 agents, 12 units, PlanFence, reused
connections, ``rpc_timeout_s = 2``), one fault per episode at a seeded point:

- ``node_kill``: SIGKILL one node; the episode must abort (``NodeDied``).
- ``node_stop``: SIGSTOP one node for 3 s; it must abort as ``node_unresponsive``.
- ``node_freeze``: SIGSTOP, for 1.1x the heartbeat timeout, the owner of a key that
  the next action asks; it must abort as ``node_unresponsive`` (not as stall).
- ``controller_kill``: SIGKILL ``testbed run`` (a child process) at a seeded time, then
  ``--resume``; every episode must be there exactly once.
- ``controller_kill_shaped``: the same on the ``fixed`` network (namespaces, the
  userspace emulator), followed by ``--resume`` (even trials) or ``testbed clean`` and
  then ``--resume`` (odd trials); no namespace of the killed run may be left.
- ``partition``: the emulator drops every packet of one host for 0.5-3 s.
- ``corrupt`` / ``duplicate`` / ``reorder``: on one host's packets for 1-2 s (corruption
  fixes the TCP checksum, so only the channel can reject it).
- ``emulator_freeze``: SIGSTOP the run's link emulator for 3 s at a seeded point (the
  ``fixed`` network); a completed episode must be flagged ``disturbed`` (its stall
  carries the freeze), or abort for a network reason.
- ``store_overwrite``: the victim's store database and WAL are overwritten in place with
  random bytes; the node must notice on its read-back and end, so the episode aborts
  (``NodeDied`` naming it), never serving from memory.
- ``disk_full``: the file system holding the stores (a 32 MiB tmpfs in a private mount
  namespace) is filled; the episode must abort naming the full disk.
- ``unread_flood`` / ``preauth_flood``: beside the episode, a roster member pipelines
  1500 fetches of an artifact-size record and never reads, or 512 replayed hellos each
  hold a partial 1 MiB frame (testbed/tools/fault_floods.py); the victim must close the
  attacker's connections and keep its memory within its byte caps, and give it back.
- ``many_source_flood`` / ``junk_flood``: the hello flood from 32 loopback addresses,
  or members' proven connections each sending a complete 1 MiB junk frame (4 rounds of
  32); the victim must stay within its node budget (``held_bytes_per_node``) and give
  the memory back.

Link kinds run on the ``fixed`` profile (namespaces, userspace emulator; root), the
others on loopback. Per kind: trials, completed, aborted, aborted with the expected
reason (``expected_reason``; link faults may also just complete), episodes lost or
duplicated, actions wrongly judged (``testbed.tools.fault_inject``), and processes,
namespaces and files left behind; and whether the kind proved what it must
(testbed/tools/fault_checks.py).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import trio
from rich.console import Console
from rich.table import Table

from testbed.campaign.parse import parse_campaign
from testbed.errors import HostError, UserError
from testbed.host.ledger import STATE_DIR, open_run_ledger, run_state_dir
from testbed.host.processes import is_running
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.run.team import heartbeat_timeout_s
from testbed.tools.fault_checks import (
    EXPECTED,
    FLOOD_KINDS,
    MUST_ABORT,
    MUST_DISTURB,
    failures,
)
from testbed.tools.fault_floods import (
    hello_flood,
    junk_flood,
    many_source_flood,
    unread_flood,
)
from testbed.tools.fault_inject import (
    FREEZE_FACTOR,
    STOP_S,
    FaultRunner,
    FloodInjector,
    Injector,
    fill_disk,
    freeze_emulator,
    kill_node,
    link_fault,
    overwrite_store,
    stop_for,
    stop_node,
)

KINDS = ("node_kill", "node_stop", "node_freeze", "controller_kill", "controller_kill_shaped",
         "partition", "corrupt", "duplicate", "reorder", "emulator_freeze", "store_overwrite",
         "disk_full", "unread_flood", "preauth_flood", "many_source_flood", "junk_flood")
LINK_KINDS = ("partition", "corrupt", "duplicate", "reorder")
EMULATOR_KINDS = (*LINK_KINDS, "emulator_freeze")  # on the userspace emulator
SHAPED_KINDS = (*EMULATOR_KINDS, "controller_kill_shaped")
DEFAULT_TRIALS = 20
FLOODS = {"unread_flood": unread_flood, "preauth_flood": hello_flood,
          "many_source_flood": many_source_flood, "junk_flood": junk_flood}
TMPFS_MIB = 32
CLONE_NEWNS = 0x00020000


@dataclass
class KindResult:
    kind: str
    trials: int
    completed: int
    aborted: int
    aborted_right_reason: int
    lost: int
    duplicated: int
    wrongly_judged: int
    processes_left: int
    namespaces_left: int
    files_left: int
    wall_s: float
    reasons: dict[str, int]
    episodes: int = 0  # episodes the trials must produce (controller kinds: 4 per run)
    victim_peak_mib: float | None = None  # floods: largest peak growth of a victim
    victim_after_mib: float | None = None  # ... and what stayed resident after it
    attacks_closed: int = 0  # floods: trials in which the victim closed the attacker
    proved: bool = False
    failed: list[str] = field(default_factory=list)


def _campaign(kind: str, trials: int, seed: int) -> dict[str, Any]:
    network = "fixed" if kind in SHAPED_KINDS else "loopback"
    return {"name": f"faults-{kind}", "seed": seed, "templates": trials,
            "options": {"rpc_timeout_s": 2, "episode_timeout_s": 60, "delay_ms": 5,
                        "durability": "normal"},
            "grid": {"policy": ["planfence"], "network": [network], "rho": [4],
                     "keys": [6], "agents": [3], "connection": ["reuse"], "units": [12]}}


def _files(prefixes: set[str], root: Path | None = None) -> set[str]:
    """Temporary directories of the runs with these ledger prefixes still there (never
    another run's: other sessions on the host run campaigns meanwhile)."""
    tmp = root or Path(tempfile.gettempdir())
    return {str(p) for prefix in prefixes for kind in ("planfence", "pft-ctl")
            for p in tmp.glob(f"{kind}-{prefix}*")}


def _namespaces_of(prefixes: set[str]) -> int:
    """Namespaces still there that one of this kind's topologies made (other runs on
    the host are not counted)."""
    netns = Path("/var/run/netns")
    if not netns.is_dir() or not prefixes:
        return 0
    return sum(1 for p in netns.iterdir() if any(p.name.startswith(f"{x}-") for x in prefixes))


def _tables(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions_path = out / "actions.parquet"
    actions = pd.read_parquet(actions_path) if actions_path.exists() else pd.DataFrame()
    return episodes, actions


def _reason_kind(reason: str) -> str:
    """An abort reason without agent names and details: ``NodeOpError: plan: RpcTimeout``."""
    parts = [p for p in reason.split(": ")
             if not re.fullmatch(r"a\d+|central|node \w+ exited; first failure", p)]
    if parts[0] in ("NodeDied", "node_unresponsive"):
        return parts[0]  # the rest names the node and what the controller saw
    return ": ".join(p.split(" ")[0] if i else p for i, p in enumerate(parts[:3]))


def _count(kind: str, episodes: pd.DataFrame, expected_keys: set[str]) -> dict[str, Any]:
    keys = Counter(episodes["episode"])
    aborted = episodes[episodes["aborted"]]
    want = EXPECTED[kind]
    right = sum(1 for r in aborted["abort_reason"] if any(w in str(r) for w in want))
    reasons = Counter(_reason_kind(str(r)) for r in aborted["abort_reason"])
    return {"trials": len(expected_keys), "completed": int((~episodes["aborted"]).sum()),
            "aborted": len(aborted), "aborted_right_reason": right,
            "lost": len(expected_keys - set(keys)),
            "duplicated": sum(n - 1 for n in keys.values() if n > 1),
            "reasons": dict(reasons)}


async def _in_process(kind: str, trials: int, seed: int, scratch: Path,
                      disk_root: Path | None) -> dict[str, Any]:
    campaign = parse_campaign(_campaign(kind, trials, seed), source=f"faults:{kind}")
    inject: Injector
    after = None
    if kind == "node_kill":
        inject = kill_node
    elif kind == "node_stop":
        inject = stop_node
    elif kind == "node_freeze":
        inject = stop_for(FREEZE_FACTOR * heartbeat_timeout_s(campaign.options.rpc_timeout_s))
    elif kind == "emulator_freeze":
        inject = freeze_emulator(STOP_S)
    elif kind == "store_overwrite":
        inject = overwrite_store
    elif kind in FLOOD_KINDS:
        inject = FloodInjector(FLOODS[kind])
    elif kind == "disk_full":
        assert disk_root is not None
        inject = fill_disk(disk_root)

        def after() -> None:
            (disk_root / "filler").unlink(missing_ok=True)
    else:
        seconds = (0.5, 3.0) if kind == "partition" else (1.0, 2.0)
        inject = link_fault(kind, seconds=seconds, rate=1.0 if kind == "partition" else 0.3)
    out = scratch / kind
    with open_run_ledger(str(out)) as ledger:
        run_prefix = ledger.prefix
        runner = FaultRunner(EpisodeRunner(campaign, workdir_root=disk_root, ledger=ledger,
                                           backend="userspace" if kind in EMULATOR_KINDS
                                           else None),
                             inject, seed=seed, after_episode=after,
                             must_abort=kind in MUST_ABORT,
                             must_disturb=kind in MUST_DISTURB,
                             at_key_owner=kind == "node_freeze")
        await run_campaign(campaign, out, resume=False, runner=runner,
                           console=Console(file=io.StringIO()))
    episodes, _ = _tables(out)
    expected = {f"{c.id}/{t}" for c, t in campaign.episodes()}
    counts = _count(kind, episodes, expected)
    await trio.sleep(1.5)  # nodes of a killed team notice their parent within 1 s
    tally = runner.tally
    found: dict[str, Any] = {
        **counts, "wrongly_judged": tally.wrongly_judged, "episodes": len(expected),
        "processes_left": tally.live_processes(),
        "namespaces_left": _namespaces_of(tally.topology_prefixes),
        "files_left": len(_files({run_prefix})),
        "channel_rejections": tally.channel_rejections}
    if isinstance(inject, FloodInjector) and inject.measures:
        found["victim_peak_mib"] = round(max(m.peak_growth_mib for m in inject.measures), 1)
        found["victim_after_mib"] = round(max(m.after_growth_mib for m in inject.measures), 1)
        found["attacks_closed"] = sum(1 for m in inject.measures if m.closed_by_victim)
    return found


def _controller_kill(kind: str, trials: int, seed: int, scratch: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    expected_total = 0
    shaped = kind == "controller_kill_shaped"
    for trial in range(trials):
        out = scratch / f"{kind}-{trial}"
        raw = _campaign(kind, 4, seed + trial)
        toml = scratch / f"{kind}-{trial}.toml"
        toml.write_text(_toml(raw))
        cmd = [sys.executable, "-m", "testbed", "run", str(toml), "--out", str(out)]
        # a temporary root of its own: what the killed and the resumed run leave there is
        # theirs alone (files_left), whatever else runs on the host
        tmp = scratch / f"{kind}-{trial}-tmp"
        tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(tmp)}
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=env)
        # python start-up, the group (namespaces and the emulator if shaped), a few episodes
        time.sleep(rng.uniform(3.0, 8.0) if shaped else rng.uniform(1.5, 4.0))
        child.kill()
        child.wait()
        pids, prefixes = _left_by(child.pid)  # what --resume (or clean) must remove
        if shaped and trial % 2:
            _testbed(["clean"], kind, env)
        # killed before it made its directory (nothing started yet): a plain run, as
        # --resume refuses a directory that does not exist
        _testbed([*cmd[3:], *(["--resume"] if out.exists() else [])], kind, env)
        campaign = parse_campaign(raw, source=f"faults:{kind}")
        expected = {f"{c.id}/{t}" for c, t in campaign.episodes()}
        expected_total += len(expected)
        episodes, actions = _tables(out)
        counts = _count("controller_kill", episodes, expected)
        for key in ("completed", "aborted", "lost", "duplicated"):
            totals[key] += int(counts[key])
        reasons.update(counts["reasons"])
        totals["processes_left"] += sum(1 for pid, ticks in pids if is_running(pid, ticks))
        totals["namespaces_left"] += _namespaces_of(prefixes)
        totals["files_left"] += len(_files({"tb"}, tmp))  # every run there is this trial's
        if not actions.empty:  # each action once, and PlanFence never releases invalid:
            # an episode with an action judged invalid is wrongly judged
            totals["duplicated"] += int(actions.duplicated(["episode", "action"]).sum())
            totals["wrongly_judged"] += int(actions.groupby("episode")["invalid"].any().sum())
    return {"trials": trials, "completed": totals["completed"], "aborted": totals["aborted"],
            "aborted_right_reason": 0, "lost": totals["lost"],
            "duplicated": totals["duplicated"], "wrongly_judged": totals["wrongly_judged"],
            "reasons": dict(reasons), "episodes": expected_total,
            "processes_left": totals["processes_left"],
            "namespaces_left": totals["namespaces_left"], "files_left": totals["files_left"]}


def _testbed(args: list[str], kind: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, timeout=300, check=False, env=env)
    if done.returncode != 0:
        raise HostError(f"faults {kind}: testbed {args[0]} failed: "
                        f"{done.stderr.strip().splitlines()[-1:]}")


def _left_by(owner_pid: int) -> tuple[list[tuple[int, int | None]], set[str]]:
    """The processes (pid, start ticks) and ledger prefixes that a killed controller's
    ledgers record: its run ledger and, on a shaped network, its topologies' and its
    shared emulator's (which carry no label)."""
    pids: list[tuple[int, int | None]] = []
    prefixes: set[str] = set()
    for state_dir in {run_state_dir(), STATE_DIR}:
        for path in state_dir.glob("tb*.json"):
            try:
                body = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if body.get("owner_pid") != owner_pid:
                continue
            prefixes.add(str(body.get("prefix")))
            pids += [(int(e["pid"]), e.get("start_ticks")) for e in body.get("entries", [])
                     if e.get("kind") == "process"]
    return pids, prefixes


def _toml(raw: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, list) else \
            "[" + ", ".join(value(x) for x in v) + "]"

    lines = [f"name = {value(raw['name'])}", f"seed = {raw['seed']}",
             f"templates = {raw['templates']}", "[options]"]
    lines += [f"{k} = {value(v)}" for k, v in raw["options"].items()]
    lines += ["[grid]"] + [f"{k} = {value(v)}" for k, v in raw["grid"].items()]
    return "\n".join(lines) + "\n"


def _private_tmpfs(scratch: Path) -> Path:
    """A small tmpfs seen only by this process and its children (a private mount
    namespace: nothing to unmount, nothing left when the process exits)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise HostError(f"faults disk_full: unshare(CLONE_NEWNS) failed (errno "
                        f"{ctypes.get_errno()}); needs root and a single-threaded start")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    root = scratch / "disk"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(root)],
                   check=True)
    return root


def run_faults(*, kinds: Sequence[str], trials: int, seed: int, console: Console
               ) -> list[KindResult]:
    """Run the suite (root); call before anything starts threads (disk_full unshares)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise UserError(f"--kinds: {bad[0]!r} is not allowed; allowed: {', '.join(KINDS)}")
    if os.geteuid() != 0:
        raise HostError("testbed faults needs root (namespaces, signals to its nodes, a "
                        "private tmpfs); run it as root")
    results: list[KindResult] = []
    with tempfile.TemporaryDirectory(prefix="pf-faults-") as tmp:
        scratch = Path(tmp)
        disk_root = _private_tmpfs(scratch) if "disk_full" in kinds else None
        try:
            results = _run_kinds(kinds, trials, seed, scratch, disk_root, console)
        finally:
            if disk_root is not None:
                subprocess.run(["umount", str(disk_root)], check=False)
    return results


def _run_kinds(kinds: Sequence[str], trials: int, seed: int, scratch: Path,
               disk_root: Path | None, console: Console) -> list[KindResult]:
    results = []
    for kind in kinds:
        console.print(f"[bold]{kind}[/]: {trials} trials")
        started = time.monotonic()
        if kind in ("controller_kill", "controller_kill_shaped"):
            counts = _controller_kill(kind, trials, seed, scratch)
        else:
            counts = trio.run(_in_process, kind, trials, seed, scratch,
                              disk_root if kind == "disk_full" else None)
        result = KindResult(
            kind=kind, trials=counts["trials"], completed=counts["completed"],
            aborted=counts["aborted"], aborted_right_reason=counts["aborted_right_reason"],
            lost=counts["lost"], duplicated=counts["duplicated"],
            wrongly_judged=counts["wrongly_judged"],
            processes_left=int(counts["processes_left"]),
            namespaces_left=int(counts.get("namespaces_left", 0)),
            files_left=int(counts["files_left"]), wall_s=round(time.monotonic() - started, 1),
            reasons=counts["reasons"], episodes=int(counts["episodes"]),
            victim_peak_mib=counts.get("victim_peak_mib"),
            victim_after_mib=counts.get("victim_after_mib"),
            attacks_closed=int(counts.get("attacks_closed", 0)))
        if counts.get("channel_rejections"):
            result.reasons["channel rejections (connections)"] = counts["channel_rejections"]
        result.failed = failures(result)
        result.proved = not result.failed
        results.append(result)
    return results


def render(results: Sequence[KindResult], console: Console) -> None:
    table = Table(title="testbed faults")
    headers = ("kind", "trials", "completed", "aborted", "right reason", "lost", "duplicated",
               "wrongly judged", "processes left", "namespaces left", "files left", "wall s",
               "proved")
    for h in headers:
        table.add_column(h, justify="left" if h == "kind" else "right")
    for r in results:
        table.add_row(r.kind, *(str(v) for v in (
            r.trials, r.completed, r.aborted, r.aborted_right_reason, r.lost, r.duplicated,
            r.wrongly_judged, r.processes_left, r.namespaces_left, r.files_left, r.wall_s)),
            "yes" if r.proved else "NO")
    console.print(table)
    for r in results:
        if r.reasons:
            console.print(f"{r.kind}: " + ", ".join(f"{k} x{v}" for k, v in r.reasons.items()))
        if r.victim_peak_mib is not None:
            console.print(f"{r.kind}: victim's peak growth {r.victim_peak_mib:g} MiB, "
                          f"{r.victim_after_mib:g} MiB after; attacker's connections "
                          f"closed by the victim in {r.attacks_closed} of {r.trials} trials")
        if r.failed:
            console.print(f"{r.kind}: NOT proved: " + "; ".join(r.failed))


def write_json(results: Sequence[KindResult], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
