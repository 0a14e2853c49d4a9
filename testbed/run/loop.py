"""The resumable campaign loop: every not-yet-committed episode, in lanes.

Rules this module obeys:

1. The run directory (``testbed.results.rundir``) makes the loop resumable: an episode
   is marked started before it runs and committed by renaming its episode shard; on
   ``--resume`` every committed episode is skipped, every other one (never started,
   or started and killed) runs.
2. ``--extend`` is ``--resume`` for a campaign that has grown: same name, seed and
   options, every template and cell of the existing run still present; the new cells
   and templates run, the committed episodes are kept (schedules depend only on the
   seed, the template and the cell, so old and new episodes are paired as if the grid
   had been that large from the start).
3. ``jobs > 1`` runs that many groups at once, each on its own topology (own run
   prefix, namespaces, emulator and node processes). Work is split per (group,
   template), so a template's policies still run back to back on one topology. On an
   emulated LTE link an episode spends almost all of its time waiting on the link
   (about 5% of one core for a whole team), so lanes do not contend. On loopback they
   would, and stall there is CPU time, so loopback units always run first and alone,
   one at a time, whatever ``jobs`` is (docs/campaigns.md).
4. The manifest records every network the campaign runs (definition, trace files with
   size and SHA-256; ``testbed.spec.networks.network_provenance``); ``--resume`` and
   ``--extend`` refuse a run whose recorded trace files have changed since.
5. An aborted episode (the runner raised :class:`EpisodeAborted`, or it outlived
   ``options.episode_timeout_s`` by :data:`BACKSTOP_GRACE_S`) is recorded with
   ``aborted = True`` and its reason, no action rows and no costs (nothing imputed);
   its ``scheduled_actions`` keep its slots in availability denominators. The group's
   topology and processes are then closed and reopened before the next episode, so a
   dead node cannot abort the rest of the group.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from testbed.results.provenance import (
    git_revision,
    host_description,
    lock_file,
    package_versions,
)
from testbed.results.rundir import RunDir
from testbed.results.schema import (
    RUNNER_ACTION_FIELDS,
    RUNNER_EPISODE_FIELDS,
    RUNNER_EPISODE_OPTIONAL,
    ResultRowError,
    check_fields,
)
from testbed.results.summary import print_summary
from testbed.run.contract import (
    BACKSTOP_GRACE_S,
    EpisodeAborted,
    EpisodeResult,
    Group,
    Runner,
    RunSummary,
)
from testbed.spec.campaign import Campaign, CampaignError, Cell, GroupKey, episode_key, fmt_number
from testbed.spec.networks import changed_files, network_provenance
from testbed.spec.parse import recorded_campaign
from testbed.spec.workload import Schedule


async def run_campaign(campaign: Campaign, out_dir: Path | str, *, resume: bool,
                       runner: Runner, console: Console, extend: bool = False,
                       jobs: int = 1) -> RunSummary:
    """Run every not-yet-committed episode of ``campaign`` into ``out_dir``."""
    if not (isinstance(jobs, int) and jobs >= 1):
        raise CampaignError(f"jobs: {jobs!r} is not allowed; allowed: an integer >= 1")
    run_dir = RunDir(out_dir)
    extended_from: dict[str, int] | None = None
    if not run_dir.is_empty():
        if not (resume or extend):
            raise CampaignError(f"{run_dir.path}: not empty; pass --resume to finish that run "
                                "(or --extend to grow it) or choose another --out")
        extended_from = _check_same_campaign(run_dir, campaign, extend=extend)
    networks = network_provenance(campaign)  # hashes the trace files before anything runs
    t0 = time.monotonic()
    run_dir.open()
    status = "interrupted"
    counts = {"ran": 0, "aborted": 0}
    progress = _progress(console)
    try:
        previous = run_dir.read_manifest()
        sessions = previous.get("sessions", [])
        session: dict[str, Any] = {"started_at": _now(), "resume": bool(sessions),
                                   "jobs": jobs}
        if extended_from is not None:
            session["extended_from"] = extended_from
        run_dir.update_manifest(
            started_at=previous.get("started_at", session["started_at"]),
            campaign=campaign.name, source=campaign.source, config=campaign.config(),
            versions=package_versions(), lock=lock_file(), git=git_revision(),
            system=host_description(),
            networks={**previous.get("networks", {}), **networks},
            sessions=[*sessions, session], status="running")
        done = run_dir.completed()
        episodes = campaign.episodes()
        todo = [(c, t) for c, t in episodes if episode_key(c, t) not in done]
        task = progress.add_task("episodes", total=len(episodes),
                                 completed=len(episodes) - len(todo))
        progress.start()
        units = _work_units(todo, jobs)

        async def lane() -> None:
            schedules = _ScheduleCache(campaign)
            while units:
                gkey, pending = units.pop(0)
                while pending:
                    cells = list(dict.fromkeys(c for c, _ in pending))
                    async with runner.open_group(gkey, cells) as group:
                        _note_group(run_dir, gkey, group)
                        while pending:
                            cell, template = pending.pop(0)
                            key = episode_key(cell, template)
                            progress.update(task, description=key)
                            was_aborted = await _run_one(campaign, run_dir, group, cell,
                                                         schedules.get(cell, template), key)
                            counts["ran"] += 1
                            counts["aborted"] += was_aborted
                            progress.advance(task)
                            if was_aborted:
                                break  # rebuild the topology and processes before going on

        if jobs == 1:
            await lane()
        else:
            # Loopback stall is CPU time: its units run first, one at a time, with no
            # other lane beside them; then the emulated-link units fill the lanes.
            emulated = [u for u in units if u[0].network != "loopback"]
            units[:] = [u for u in units if u[0].network == "loopback"]
            await lane()
            units[:] = emulated
            await _run_lanes(lane, min(jobs, len(units)))
        status = "complete"
    finally:
        progress.stop()
        sessions = run_dir.read_manifest().get("sessions", [])
        if sessions:
            sessions[-1] = {**sessions[-1], "ended_at": _now(), "status": status}
        run_dir.update_manifest(sessions=sessions, status=status, ended_at=_now())
        if run_dir.completed():
            run_dir.consolidate()
        run_dir.close()
    if status == "complete":
        print_summary(run_dir.path, console)
    return RunSummary(run_dir.path, len(campaign.episodes()), len(done), counts["ran"],
                      counts["aborted"], time.monotonic() - t0)


WorkUnit = tuple[GroupKey, list[tuple[Cell, str]]]


def _work_units(todo: Sequence[tuple[Cell, str]], jobs: int) -> list[WorkUnit]:
    """What one lane runs on one topology: a whole group, or with several lanes one
    (group, template) slice of it, so that paired policies stay back to back."""
    def unit_key(item: tuple[Cell, str]) -> Any:
        cell, template = item
        return cell.group_key if jobs == 1 else (cell.group_key, template)

    return [(items[0][0].group_key, items)
            for items in (list(g) for _, g in itertools.groupby(todo, key=unit_key))]


async def _run_lanes(lane: Callable[[], Awaitable[None]], count: int) -> None:
    """Run ``count`` lanes in one nursery; a failure in one stops all of them (their
    episodes stay "started" and run again on --resume). A single failure is re-raised
    as itself, not as an exception group, so callers see the same errors as with one
    lane."""
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(lane)
    except BaseExceptionGroup as group:
        leaves = [e for e in _leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class _ScheduleCache:
    """Schedules are identical across the policies of a template; build each once."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.last: tuple[tuple[Any, ...], Schedule] | None = None

    def get(self, cell: Cell, template: str) -> Schedule:
        ident = (template, cell.agents, cell.keys, cell.units, cell.deps, cell.rho, cell.tier)
        if self.last is None or self.last[0] != ident:
            self.last = (ident, self.campaign.schedule(cell, template))
        return self.last[1]


async def _run_one(campaign: Campaign, run_dir: RunDir, group: Group, cell: Cell,
                   schedule: Schedule, key: str) -> bool:
    """Run and commit one episode; True if it was aborted."""
    run_dir.mark_started(key)
    started = time.monotonic()
    result: EpisodeResult | None = None
    reason = ""
    try:
        limit_s = campaign.options.episode_timeout_s
        with trio.move_on_after(limit_s + BACKSTOP_GRACE_S) as scope:
            result = await group.run_episode(cell, schedule)
        if scope.cancelled_caught:
            reason = (f"episode exceeded options.episode_timeout_s ({fmt_number(limit_s)} s) "
                      f"by {fmt_number(BACKSTOP_GRACE_S)} s; the runner did not stop it")
    except EpisodeAborted as exc:
        reason = exc.reason or "aborted (no reason given)"
        result = None
    wall_s = time.monotonic() - started
    base = {"campaign": campaign.name, **cell.columns(), "backend": group.backend,
            "episode": key, "family": schedule.family, "template": schedule.template,
            "schedule_digest": schedule.digest}
    if result is None:
        episode_row = {**base, "seed": campaign.seed,
                       "scheduled_actions": schedule.counts.actions, "attempted_actions": 0,
                       "updates": schedule.counts.updates, "aborted": True,
                       "abort_reason": reason, "wall_s": wall_s}
        run_dir.record_episode(key, [], episode_row)
        return True
    actions, episode_row = _rows(base, campaign, schedule, result, wall_s, key)
    run_dir.record_episode(key, actions, episode_row)
    return False


def _rows(base: dict[str, Any], campaign: Campaign, schedule: Schedule, result: EpisodeResult,
          wall_s: float, key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Full result rows from the runner's measurements (checking the field contract)."""
    acts = {a.action: a for a in schedule.acts()}
    planners = {p.action: p.planner for p in schedule.plans()}
    rows = []
    for row in result.actions:
        check_fields(row, RUNNER_ACTION_FIELDS, RUNNER_ACTION_FIELDS, f"episode {key}: action")
        act = acts.get(row["action"])
        if act is None:
            raise ResultRowError(f"episode {key}: action {row['action']!r} is not scheduled")
        if row["outcome"] not in ("released", "blocked"):
            raise ResultRowError(f"episode {key}: action {row['action']}: outcome "
                                 f"{row['outcome']!r}; allowed: released, blocked")
        rows.append({**base, "unit": act.unit, "planner": planners[act.action],
                     "executor": act.executor, **row})
    reported = [r["action"] for r in rows]
    if sorted(reported) != sorted(acts):
        raise ResultRowError(f"episode {key}: action rows {len(reported)} do not match the "
                             f"{len(acts)} scheduled actions one to one")
    required = [f for f in RUNNER_EPISODE_FIELDS if f not in RUNNER_EPISODE_OPTIONAL]
    check_fields(result.episode, required, RUNNER_EPISODE_FIELDS, f"episode {key}: episode")
    episode_row = {**base, "seed": campaign.seed, "scheduled_actions": schedule.counts.actions,
                   "attempted_actions": len(rows), "updates": schedule.counts.updates,
                   "aborted": False, "abort_reason": None, "wall_s": wall_s,
                   **result.episode}
    return rows, episode_row


def _note_group(run_dir: RunDir, gkey: GroupKey, group: Group) -> None:
    manifest = run_dir.read_manifest()
    groups = dict(manifest.get("groups", {}))
    groups[gkey.id] = {"key": gkey._asdict(), "backend": group.backend,
                       **dict(group.description)}
    backends = sorted({str(g.get("backend")) for g in groups.values()})
    run_dir.update_manifest(groups=groups, backend=", ".join(backends))


def _check_same_campaign(run_dir: RunDir, campaign: Campaign, *,
                         extend: bool) -> dict[str, int] | None:
    """Refuse to resume (or extend) a directory that holds another campaign. With
    ``extend`` returns the size of the run being grown."""
    try:
        manifest = run_dir.read_manifest()
    except (ValueError, OSError) as exc:
        raise CampaignError(f"{run_dir.manifest_path}: unreadable ({exc}); "
                            "choose another --out") from None
    old = manifest.get("config")
    if not isinstance(old, dict):
        raise CampaignError(f"{run_dir.path}: no campaign manifest; --resume needs a directory "
                            "written by `testbed run`")
    new = campaign.config()
    flag = "--extend" if extend else "--resume"
    changed = changed_files(manifest.get("networks") or {})
    if changed is not None:
        raise CampaignError(f"{flag}: {changed}")
    if not extend:
        differing = [k for k in new if old.get(k) != new[k]]
        if differing:
            raise CampaignError(f"--resume: {run_dir.path} holds a different campaign (field "
                                f"{differing[0]}); rerun with the same campaign, grow it with "
                                "--extend, or choose another --out")
        return None
    differing = [k for k in ("name", "seed", "options") if old.get(k) != new[k]]
    if differing:
        raise CampaignError(f"--extend: {run_dir.path} holds a campaign with another "
                            f"{differing[0]}; only grid, templates and description may change")
    try:
        previous = recorded_campaign(old, source=str(run_dir.manifest_path))
    except CampaignError as exc:
        raise CampaignError(f"--extend: the manifest's campaign no longer parses ({exc})"
                            ) from None
    lost_templates = [t for t in previous.templates if t not in campaign.templates]
    if lost_templates:
        raise CampaignError(f"--extend: template {lost_templates[0]} of the existing run is "
                            "missing; an extended campaign keeps every template")
    cells = {c.id for c in campaign.cells()}
    previous_cells = previous.cells()
    lost_cells = [c.id for c in previous_cells if c.id not in cells]
    if lost_cells:
        raise CampaignError(f"--extend: cell {lost_cells[0]} of the existing run is missing "
                            "from the grid; an extended campaign keeps every cell")
    return {"templates": len(previous.templates), "cells": len(previous_cells)}


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=console, transient=False,
                    refresh_per_second=2)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
