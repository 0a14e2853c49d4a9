"""The resumable campaign loop: every not-yet-committed episode, in lanes.

Rules this module obeys:

1. The run directory (``testbed.results.rundir``) makes the loop resumable: an episode
   is marked started before it runs (before it is sent, on a cluster) and committed by
   renaming its episode shard; this loop is its only writer, whatever engine runs the
   episodes (``testbed.run.engines``); on
   ``--resume`` every committed episode is skipped, every other one (never started,
   or started and killed) runs.
2. ``--extend`` is ``--resume`` for a campaign that has grown: same name, seed and
   options, every template and cell of the existing run still present; the new cells
   and templates run, the committed episodes are kept (schedules depend only on the
   seed, the template and the cell, so old and new episodes are paired as if the grid
   had been that large from the start).
3. ``jobs > 1`` runs that many groups at once, each on its own topology (own run
   prefix, namespaces, emulator and node processes), and a cluster engine runs as many
   as its workers' lanes. Work is split per (group, template) (``plan_units``), so a
   template's policies still run back to back on one topology. On an
   emulated LTE link an episode spends almost all of its time waiting on the link
   (about 5% of one core for a whole team), so lanes do not contend. On loopback they
   would, and stall there is CPU time, so loopback units always run first and alone,
   one at a time, whatever ``jobs`` is (docs/campaigns.md).
4. The manifest records every network the campaign runs (definition, trace files with
   size and SHA-256; ``testbed.campaign.networks.network_provenance``); ``--resume`` and
   ``--extend`` refuse a run whose recorded trace files have changed since; the same for
   its policy plugins (distribution, version, source SHA-256;
   ``testbed.campaign.plugins``).
5. An aborted episode (the runner raised :class:`EpisodeAborted`, or it outlived
   ``options.episode_timeout_s`` by :data:`BACKSTOP_GRACE_S`) is recorded with
   ``aborted = True`` and its reason, no action rows and no costs (nothing imputed);
   its ``scheduled_actions`` keep its slots in availability denominators. The group's
   topology and processes are then closed and reopened before the next episode, so a
   dead node cannot abort the rest of the group. An abort the infrastructure caused
   (a live episode's model server gave no answer; ``testbed.results.aborts``) is
   recorded the same way and run again by ``--resume`` as the next attempt.
6. Attempts (``testbed/run/attempts.py``): with ``repeats`` or ``rerun_disturbed`` an
   episode runs more than once with the same schedule; each attempt is committed on its
   own with its ``attempt`` and ``repeat`` numbers, and what is still to run is planned
   from the committed attempts, so ``--resume`` neither repeats a committed attempt nor
   loses an interrupted rerun. The session in the manifest records both settings.
7. A live campaign's model endpoint is probed before anything is created: unreachable is
   a one-line HostError, a model it does not serve a one-line UserError; the manifest
   records the model name and the server's reported version (never the API key).
8. A run that stops before its first episode is committed (a host or user error at the
   first topology, Ctrl-C) in a directory that held no run removes what it created
   (``RunDir.discard``): the next plain run on that ``--out`` starts afresh. What a
   run can check beforehand it checks before anything exists (``testbed.run.preflight``).
9. Every session (the first run, each ``--resume`` and ``--extend``) records the code it
   ran (revision, dirty flags, product-code digest), the lock file's digest and, at its
   end, how many episodes it committed; each episode row names its ``session`` (1
   upward). ``--resume``/``--extend`` refuse code whose digest differs from the run's
   last session unless ``allow_code_change`` (``testbed.results.sessions``); the
   manifest then tells which episodes came from which code.
10. A full results disk (ENOSPC or a quota, writing a shard, the ledger or the manifest)
   ends the run with one line naming the file (``testbed.results.atomic``
   ``ResultsDiskFull``, exit 3); what was committed stays, nothing is torn, and
   ``--resume`` continues once there is space.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from testbed.campaign.command import COMMAND_KIND
from testbed.campaign.model import Campaign, CampaignError, episode_key
from testbed.campaign.networks import changed_files, network_provenance
from testbed.campaign.parse import recorded_campaign
from testbed.campaign.plugins import changed as changed_plugins
from testbed.campaign.plugins import provenance as plugin_provenance
from testbed.campaign.workload import Schedule
from testbed.host.lanes import HostLanes
from testbed.host.userns import privilege
from testbed.results import verdict
from testbed.results.atomic import ResultsDiskFull, disk_full_in
from testbed.results.cpu_speed import python_probe_ms
from testbed.results.decisions import write_decisions
from testbed.results.history import write_history
from testbed.results.provenance import (
    code_provenance,
    host_description,
    lock_file,
    package_versions,
)
from testbed.results.reference import check_reference_run
from testbed.results.rundir import RunDir
from testbed.results.schema import (
    RESULT_SCHEMA_VERSION,
    RUNNER_ACTION_FIELDS,
    RUNNER_ACTION_OPTIONAL,
    RUNNER_EPISODE_FIELDS,
    RUNNER_EPISODE_OPTIONAL,
    ResultRowError,
    check_fields,
)
from testbed.results.sessions import check_same_code
from testbed.results.summary import print_summary
from testbed.run.attempts import AttemptPolicy, EpisodePlan, plan_episode
from testbed.run.command_rows import command_rows
from testbed.run.contract import EpisodeResult, Runner, RunSummary
from testbed.run.engines import Engine, LocalEngine
from testbed.run.failures import UnitFailure, describe_failure, record_failure
from testbed.run.model_access import probe_model
from testbed.run.progress import ProgressLike, open_progress
from testbed.run.units import EpisodeOutcome, plan_units, unshaped_networks


async def run_campaign(campaign: Campaign, out_dir: Path | str, *, resume: bool,
                       console: Console, runner: Runner | None = None,
                       engine: Engine | None = None, extend: bool = False,
                       jobs: int = 1, attempts: AttemptPolicy | None = None,
                       host: HostLanes | None = None, allow_dirty: bool = False,
                       allow_code_change: bool = False,
                       allow_side_branch: bool = False) -> RunSummary:
    """Run every not-yet-committed episode of ``campaign`` into ``out_dir``.

    ``engine`` runs the work units (default: :class:`LocalEngine` over ``runner`` with
    ``jobs`` lanes, holding lanes of the host's budget ``host`` if given; the progress
    line then says who holds the host); ``attempts`` the repeats and reruns of each
    episode (rule 6). A run into the repository's results/ needs a committed checkout
    on the main line unless ``allow_dirty`` / ``allow_side_branch``
    (``testbed.results.reference``); resuming with other code needs ``allow_code_change``
    (rule 9).
    """
    policy = attempts or AttemptPolicy()
    if not (isinstance(jobs, int) and jobs >= 1):
        raise CampaignError(f"jobs: {jobs!r} is not allowed; allowed: an integer >= 1")
    if engine is None:
        if runner is None:
            raise ValueError("run_campaign: give a runner or an engine")
        engine = LocalEngine(runner, jobs=jobs, host=host)
    reference = check_reference_run(Path(out_dir), allow_dirty=allow_dirty,
                                    allow_side_branch=allow_side_branch)
    code = {**code_provenance(), **reference}
    run_dir = RunDir(out_dir)
    extended_from: dict[str, int] | None = None
    fresh = run_dir.is_empty()  # rule 8: a failed start here leaves nothing
    made_folder = not run_dir.path.exists()
    if not fresh:
        if not (resume or extend):
            raise CampaignError(f"{run_dir.path}: not empty; pass --resume to finish that run "
                                "(or --extend to grow it) or choose another --out")
        extended_from = _check_same_campaign(run_dir, campaign, extend=extend)
        check_same_code(run_dir.read_manifest(), code,
                        flag="--extend" if extend else "--resume", allowed=allow_code_change)
    networks = network_provenance(campaign)  # hashes the trace files before anything runs
    plugins = plugin_provenance(campaign)
    model = await probe_model(campaign)  # a live campaign's endpoint, before any episode
    t0 = time.monotonic()
    run_dir.open()
    status = "interrupted"
    counts = {"ran": 0, "aborted": 0}
    failures: list[UnitFailure] = []
    progress = open_progress(console)
    try:
        previous = run_dir.read_manifest()
        sessions = previous.get("sessions", [])
        session_index = len(sessions) + 1
        lock = lock_file()
        session: dict[str, Any] = {"started_at": _now(), "resume": bool(sessions),
                                   "git": code, "lock_sha256": lock["sha256"],
                                   "jobs": jobs, "execution": engine.describe(),
                                   "repeats": policy.repeats,
                                   "rerun_disturbed": policy.rerun_disturbed,
                                   # how fast this host ran Python (cpu_speed.py)
                                   "python_probe_ms": python_probe_ms()}
        if extended_from is not None:
            session["extended_from"] = extended_from
        if allow_code_change:
            session["allow_code_change"] = True
        run_dir.update_manifest(
            schema_version=RESULT_SCHEMA_VERSION, disturbance_verdict=verdict.describe(),
            started_at=previous.get("started_at", session["started_at"]),
            campaign=campaign.name, source=campaign.source, config=campaign.config(),
            versions=package_versions(), lock=lock, git=code,
            system={**host_description(), "privilege": privilege()},
            execution=engine.describe(),
            networks={**previous.get("networks", {}), **networks},
            **({"plugins": {**previous.get("plugins", {}), **plugins}}
               if plugins or "plugins" in previous else {}),
            **({"model": model} if model is not None else {}),
            sessions=[*sessions, session], status="running")
        done = run_dir.completed()
        episodes = campaign.episodes()
        recorded = run_dir.attempts()
        plans: dict[str, EpisodePlan] = {}
        for c, t in episodes:
            plan = plan_episode(recorded.get(episode_key(c, t), []), policy)
            if plan is not None:
                plans[episode_key(c, t)] = plan
        todo = [(c, t) for c, t in episodes if episode_key(c, t) in plans]
        slots = len(episodes) * policy.repeats
        task = progress.add_task("episodes", total=slots, host="",
                                 completed=slots - sum(len(p.slots) for p in plans.values()))
        progress.start()
        if host is not None:
            host.on_status = lambda text: _host_status(progress, task, text)
        noted: set[str] = set()

        def on_start(key: str) -> None:
            run_dir.mark_started(key)
            progress.update(task, description=key)

        def on_outcome(outcome: EpisodeOutcome) -> None:
            if outcome.group.id not in noted:
                noted.add(outcome.group.id)
                _note_group(run_dir, outcome)
            counts["ran"] += 1
            counts["aborted"] += commit_outcome(campaign, run_dir, outcome, session_index)
            if not outcome.rerun:
                progress.advance(task)

        def on_failure(failure: UnitFailure) -> None:
            record_failure(run_dir, failure)
            progress.console.print(describe_failure(failure))
            if not failure.retried:
                failures.append(failure)

        units = plan_units(todo, per_template=engine.per_template, plans=plans,
                           unshaped=unshaped_networks(campaign))
        try:
            await engine.run(units, campaign, on_start=on_start, on_outcome=on_outcome,
                             on_failure=on_failure)
        except BaseExceptionGroup as group:  # a full results disk: one line (rule 10)
            full = disk_full_in(group, run_dir.path)
            if full is None:
                raise
            raise full from None
        status = "complete"
    finally:
        progress.stop()
        if fresh and status != "complete" and not run_dir.completed():
            run_dir.discard(remove_folder=made_folder)  # rule 8: a failed start
        else:
            try:
                sessions = run_dir.read_manifest().get("sessions", [])
                if sessions:
                    sessions[-1] = {**sessions[-1], "ended_at": _now(), "status": status,
                                    "episodes": counts["ran"],  # committed attempts (rule 9)
                                    "execution": engine.describe()}  # what happened in it
                run_dir.update_manifest(sessions=sessions, status=status, ended_at=_now())
                if run_dir.completed():
                    run_dir.consolidate()
            except ResultsDiskFull:
                if status == "complete":
                    raise
                # else what ended the run is on its way up; the manifest stays as it was
            finally:
                run_dir.close()
    if status == "complete":
        print_summary(run_dir.path, console)
    return RunSummary(run_dir.path, len(campaign.episodes()),
                      len(done - {episode_key(c, t) for c, t in todo}), counts["ran"],
                      counts["aborted"], time.monotonic() - t0, tuple(failures))


def commit_outcome(campaign: Campaign, run_dir: RunDir, outcome: EpisodeOutcome,
                   session: int | None = None) -> bool:
    """Turn one outcome into result rows and commit them (the episode row names the run's
    ``session`` that made it, rule 9); True if it was aborted."""
    key, cell = outcome.key, outcome.cell
    schedule = campaign.schedule(cell, outcome.template)
    base = {"campaign": campaign.name, **cell.columns(), "backend": outcome.backend,
            "episode": key, "family": schedule.family, "template": schedule.template,
            "schedule_digest": schedule.digest, "attempt": outcome.attempt}
    if outcome.result is None:
        episode_row = {**base, "seed": campaign.seed, "repeat": outcome.repeat,
                       "scheduled_actions": schedule.counts.actions, "attempted_actions": 0,
                       "updates": schedule.counts.updates, "aborted": True,
                       "abort_reason": outcome.abort_reason, "wall_s": outcome.wall_s,
                       "worker": outcome.worker, "session": session}
        run_dir.record_episode(key, [], episode_row)
        return True
    rows = command_rows if campaign.kind == COMMAND_KIND else _rows
    actions, episode_row = rows(base, campaign, schedule, outcome.result, outcome.wall_s, key)
    if outcome.result.decisions:  # before the commit point: a committed episode has them
        write_decisions(run_dir.path, key, outcome.result.decisions,
                        {k: base[k] for k in ("episode", "cell", "policy", "family", "template")})
    if outcome.result.history:  # likewise: a committed episode has its history
        write_history(run_dir.path, key, outcome.result.history, outcome.attempt)
    run_dir.record_episode(key, actions, {**episode_row, "worker": outcome.worker,
                                          "repeat": outcome.repeat, "session": session})
    return False


def _rows(base: dict[str, Any], campaign: Campaign, schedule: Schedule, result: EpisodeResult,
          wall_s: float, key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Full result rows from the runner's measurements (checking the field contract)."""
    acts = {a.action: a for a in schedule.acts()}
    planners = {p.action: p.planner for p in schedule.plans()}
    rows = []
    for row in result.actions:
        check_fields(row, RUNNER_ACTION_FIELDS, (*RUNNER_ACTION_FIELDS, *RUNNER_ACTION_OPTIONAL),
                     f"episode {key}: action")
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


def _note_group(run_dir: RunDir, outcome: EpisodeOutcome) -> None:
    manifest = run_dir.read_manifest()
    groups = dict(manifest.get("groups", {}))
    gkey = outcome.group
    groups[gkey.id] = {"key": gkey._asdict(), "backend": outcome.backend,
                       **outcome.group_description}
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
    changed = changed_files(manifest.get("networks") or {}) \
        or changed_plugins(manifest.get("plugins") or {})
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


def _host_status(progress: ProgressLike, task: Any, text: str) -> None:
    """Who holds the host, on the progress line; waiting is also printed once per
    change, so a log (not a terminal) says why the run stood still."""
    progress.update(task, host=text)
    if "waiting" in text:
        progress.console.print(text)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
