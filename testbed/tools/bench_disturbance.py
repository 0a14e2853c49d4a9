"""``testbed bench disturbance``: how much of the nodes' run-queue wait reaches the stall.

The disturbance verdict (testbed/run/disturbance.py) turns what an episode measured of
CPU contention (its nodes' run-queue wait) into a bound on how far the contention can
have moved its stall. This benchmark measures that sensitivity.

Rules this module obeys:

1. Per network (``loopback``: stall is CPU work; ``fixed``: a 20 ms link, stall is mostly
   link time), one team of real node processes runs the same schedules in rounds; each
   round runs every template once in every arm (0, then 1, then 2 busy processes beside
   the nodes; the arms' order rotates from round to round). The team's node processes
   and the busy processes share one CPU in every arm (all pinned to it), so arms differ
   only in the busy processes. Nothing runs at real-time priority: the contention is
   what an ordinary neighbour causes.
2. Each arm with busy processes is paired with the quiet arm of the same template and
   round: the change in stall per action and in the nodes' run-queue wait per action.
   The sensitivity ``k`` is the ratio estimator over the pairs (sum of stall changes
   over sum of wait changes), with a seeded bootstrap 95% interval over pairs; ``k_hi``
   (its upper end) is what the verdict uses: an episode's stall can have moved by at
   most ``k_hi`` x its wait per action.
3. A team's own contention is not a disturbance: five nodes and the controller on two
   CPUs wait for each other even on an idle host, in every policy and every run alike.
   So each network also runs a quiet arm with nothing pinned and no busy process (the
   team as a campaign runs it, one lane), and its median share of the nodes' runnable
   time spent waiting (``own_wait_share``) is the level the verdict counts wait above.
   Run it on a host as quiet as you can make it; the result records the load.
4. The JSON result holds every episode, the pairs and the fit per network kind
   (``loopback`` for unshaped networks, ``link`` for shaped ones), with the host, its
   CPU model, the revision and the date; ``--write-calibration`` also writes the fit
   into the verdict's calibration file (``testbed/results/disturbance.json``).
5. The busy processes die with this process (``PR_SET_PDEATHSIG``) and are stopped by
   pid after each arm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from testbed.campaign.parse import parse_campaign
from testbed.results.provenance import git_revision, host_description
from testbed.run.disturbance import CALIBRATION_PATH, write_calibration
from testbed.run.episode import EpisodeRunner

HOG_LEVELS: tuple[int, ...] = (0, 1, 2)
#: The paper's team size and the reference runs' (their own contention is what rule 3 measures).
AGENTS = 5
NETWORK_KINDS = {"loopback": "loopback", "fixed": "link"}
HOG_CODE = ("import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
            "while True: pass")
BOOTSTRAP_DRAWS = 2000
SEED = 20261206


def _campaign(network: str, templates: int) -> Any:
    return parse_campaign({
        "name": f"disturbance-{network}", "seed": 7, "templates": templates,
        "options": {"episode_timeout_s": 300},
        "grid": {"policy": ["planfence"], "network": [network], "agents": [AGENTS], "keys": [8],
                 "units": [16], "rho": [4]},
    })


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def _pin(pid: int, cpus: set[int]) -> None:
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


@contextmanager
def _hogs(count: int, cpu: int) -> Iterator[list[int]]:
    procs = [subprocess.Popen([sys.executable, "-c", HOG_CODE], stdin=subprocess.DEVNULL)
             for _ in range(count)]
    try:
        for proc in procs:
            _pin(proc.pid, {cpu})
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _row(network: str, template: str, round_: int, hogs: int, result: Any) -> dict[str, Any]:
    actions = max(1, len(result.actions))
    episode = result.episode
    wait = float(episode.get("node_runq_wait_ms") or 0.0)
    cpu = float(episode.get("node_cpu_ms") or 0.0)
    return {"network": network, "kind": NETWORK_KINDS.get(network, "link"),
            "template": template, "round": round_, "hogs": hogs, "actions": actions,
            "stall_ms_per_action": float(episode["stall_ms_per_action"]),
            "runq_ms_per_action": wait / actions,
            "wait_share": wait / (wait + cpu) if wait + cpu > 0 else 0.0,
            "host_steal_pct": episode.get("host_steal_pct"),
            "disturbed_recorded": bool(episode.get("disturbed"))}


async def _measure_network(network: str, templates: int, rounds: int, cpu: int,
                           stores: Path, say: Console) -> list[dict[str, Any]]:
    campaign = _campaign(network, templates)
    episodes = campaign.episodes()
    cell = episodes[0][0]
    runner = EpisodeRunner(campaign, workdir_root=stores)
    rows: list[dict[str, Any]] = []
    async with runner.open_group(cell.group_key, [cell]) as group:
        team = group.team
        pids = [team.pid(agent) for agent in team.members]
        await group.run_episode(cell, campaign.schedule(cell, episodes[0][1]))  # warm-up
        for round_ in range(rounds):  # rule 3: the team alone, as a campaign runs it
            for _, template in episodes:
                result = await group.run_episode(cell, campaign.schedule(cell, template))
                row = _row(network, template, round_, -1, result)
                rows.append(row)
                say.print(f"{network} round {round_ + 1}/{rounds} {template} alone: wait "
                          f"{row['wait_share']:.0%} of runnable time", markup=False)
        for pid in pids:
            if pid is not None:
                _pin(pid, {cpu})
        for round_ in range(rounds):
            levels = HOG_LEVELS[round_ % len(HOG_LEVELS):] + HOG_LEVELS[:round_ % len(
                HOG_LEVELS)]
            for _, template in episodes:
                schedule = campaign.schedule(cell, template)
                for hogs in levels:
                    with _hogs(hogs, cpu):
                        result = await group.run_episode(cell, schedule)
                    row = _row(network, template, round_, hogs, result)
                    rows.append(row)
                    say.print(f"{network} round {round_ + 1}/{rounds} {template} hogs {hogs}: "
                              f"stall {row['stall_ms_per_action']:.1f} ms/action, wait "
                              f"{row['runq_ms_per_action']:.1f} ms/action", markup=False)
    return rows


def pairs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rule 2: every arm with busy processes against the quiet arm of its template and
    round."""
    quiet = {(r["network"], r["template"], r["round"]): r for r in rows if r["hogs"] == 0}
    out = []
    for r in rows:
        base = quiet.get((r["network"], r["template"], r["round"]))
        if r["hogs"] <= 0 or base is None:
            continue
        out.append({"network": r["network"], "kind": r["kind"], "hogs": r["hogs"],
                    "d_stall_ms": r["stall_ms_per_action"] - base["stall_ms_per_action"],
                    "d_wait_ms": r["runq_ms_per_action"] - base["runq_ms_per_action"]})
    return out


def fit(pair_rows: Sequence[dict[str, Any]], *, seed: int = SEED,
        draws: int = BOOTSTRAP_DRAWS) -> dict[str, Any]:
    """Rule 2: the ratio estimator k and its bootstrap interval (pure)."""
    d_stall = np.array([p["d_stall_ms"] for p in pair_rows], dtype=float)
    d_wait = np.array([p["d_wait_ms"] for p in pair_rows], dtype=float)
    if len(d_stall) == 0 or d_wait.sum() <= 0:
        return {"pairs": len(d_stall), "k": None, "k_lo": None, "k_hi": None}
    k = float(d_stall.sum() / d_wait.sum())
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(d_stall), size=(draws, len(d_stall)))
    waits = d_wait[picks].sum(axis=1)
    ok = waits > 0
    boot = d_stall[picks].sum(axis=1)[ok] / waits[ok]
    lo, hi = (float(np.quantile(boot, q)) for q in (0.025, 0.975))
    return {"pairs": len(d_stall), "k": k, "k_lo": lo, "k_hi": hi,
            "d_wait_ms_median": float(np.median(d_wait)),
            "d_stall_ms_median": float(np.median(d_stall))}


async def _measure(networks: Sequence[str], templates: int, rounds: int, cpu: int,
                   stores: Path, say: Console) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for network in networks:
        rows += await _measure_network(network, templates, rounds, cpu, stores, say)
    return rows


def bench_disturbance(json_path: Path | None, say: Console, *,
                      networks: Sequence[str] = ("loopback", "fixed"), templates: int = 3,
                      rounds: int = 2, write: bool = False) -> dict[str, Any]:
    """Rules 1-3; returns the result (and writes it to ``json_path`` when given)."""
    import json
    from functools import partial

    import trio

    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1]
    t0 = time.monotonic()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="pf-disturbance-", dir=shm) as stores:
        rows = trio.run(partial(_measure, networks, templates, rounds, cpu, Path(stores), say))
    all_pairs = pairs(rows)
    fits = {kind: fit([p for p in all_pairs if p["kind"] == kind])
            for kind in sorted({p["kind"] for p in all_pairs})}
    for kind, alone in ((k, [r for r in rows if r["kind"] == k and r["hogs"] < 0])
                        for k in fits):
        fits[kind]["own_wait_share"] = float(np.median(
            [r["wait_share"] for r in alone])) if alone else None
        fits[kind]["alone_wait_ms_median"] = float(np.median(
            [r["runq_ms_per_action"] for r in alone])) if alone else None
    for kind, quiet in ((k, [r for r in rows if r["kind"] == k and r["hogs"] == 0])
                        for k in fits):
        fits[kind]["quiet_wait_ms_median"] = float(np.median(
            [r["runq_ms_per_action"] for r in quiet])) if quiet else None
        fits[kind]["quiet_stall_ms_median"] = float(np.median(
            [r["stall_ms_per_action"] for r in quiet])) if quiet else None
    git = git_revision()
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = {"bench": "disturbance", "measured_at": measured_at,
              "git": git, "system": host_description(),
              "load_1m_at_end": os.getloadavg()[0], "wall_s": time.monotonic() - t0,
              "settings": {"networks": list(networks), "templates": templates,
                           "rounds": rounds, "hog_levels": list(HOG_LEVELS), "cpu": cpu},
              "fits": fits, "pairs": all_pairs, "episodes": rows}
    table = Table("kind", "pairs", "k", "95% interval", "own wait share",
                  "pinned quiet wait ms/action", "pinned quiet stall ms/action",
                  title="stall change per ms of run-queue wait")
    for kind, f in fits.items():
        interval = "-" if f["k"] is None else f"{f['k_lo']:.3f} .. {f['k_hi']:.3f}"
        table.add_row(kind, str(f["pairs"]), "-" if f["k"] is None else f"{f['k']:.3f}",
                      interval, f"{f.get('own_wait_share') or 0:.1%}",
                      f"{f.get('quiet_wait_ms_median') or 0:.2f}",
                      f"{f.get('quiet_stall_ms_median') or 0:.1f}")
    say.print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    if write:
        source = str(json_path) if json_path is not None else "testbed bench disturbance"
        write_calibration({kind: f["k_hi"] for kind, f in fits.items()
                           if f["k_hi"] is not None},
                          {kind: f["own_wait_share"] for kind, f in fits.items()
                           if f.get("own_wait_share") is not None}, source=source,
                          revision=str(git.get("revision")), measured_at=measured_at)
        say.print(f"calibration written: {CALIBRATION_PATH}", markup=False)
    return result
