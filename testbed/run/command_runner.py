"""The runner of command workloads: your own programs, per host, in every episode.

The campaign loop's ``Runner`` for ``kind = "command"`` campaigns
(``testbed.campaign.command``), in place of the node team. Rules:

1. A group gets one topology: the cell's agents ``a0``.. plus ``command.hosts``, each
   with its own link from the network (``hosts.NAME`` tables, ``unshaped`` included), a
   hosts file naming them all, and a directory for its programs
   (``testbed.net.session.open_host_network``).
2. An episode writes its schedule (``testbed.campaign.schedule_file``) to
   ``<run>/commands/<episode>/schedule.json``, starts the ``[[command.run]]`` entries in
   order (services and readiness as ``testbed.net.session`` runs them; the traces restart
   right before the first run that is not a service), and ends when those have exited,
   or at ``command.timeout_s`` (at most ``options.episode_timeout_s``). Each program's
   output and metrics stay beside the schedule (``<label>.out``, ``.err``,
   ``.metrics.jsonl``): the raw record of the episode.
3. Every program's environment (besides ``testbed.net.commands`` rule 3, the table's
   ``env`` and the run's own, with their placeholders filled in as ``argv``'s:
   ``testbed.campaign.command`` rule 3): ``TESTBED_METRICS``, ``TESTBED_SCHEDULE``,
   ``TESTBED_EPISODE``, ``TESTBED_SEED`` (the same for every policy and network of a
   template, so paired episodes draw alike), ``TESTBED_POLICY``, ``TESTBED_NETWORK``,
   ``TESTBED_TEMPLATE``, ``TESTBED_UNIT_MS``, ``TESTBED_KEYS`` and ``TESTBED_OWNED_KEYS``
   (the schedule's keyspace, and the keys this host owns), and ``TESTBED_HISTORY``: where
   the program may write its history (docs/history.md), ``<label>.history.jsonl`` beside
   its metrics.
4. The episode is aborted (nothing imputed) when a run is not ready in time, when the
   timeout stops a run that is not a service, when a run or a service exits with a
   failure on its own, or when a metrics file breaks the protocol
   (``testbed.run.metrics``); the reason names the program and quotes the end of its
   stderr. Likewise when a history the programs wrote breaks its format or cannot be
   judged (a header naming another host, a version nobody wrote: one line naming it).
5. The result: one action row per reported action (``testbed.run.metrics``), and the
   episode's link columns measured from the trace restart to the end (as
   ``testbed.run.episode`` rule 7), bytes per host and direction, how each program
   ended, and the programs' ``episode`` metrics. When programs wrote histories, the
   checker's columns (``HISTORY_EPISODE_FIELDS``) judge the actions from them, and the
   files go to the run directory's ``history/<episode>/`` (named by program label).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from protocols.history import HistoryError
from testbed.campaign.command import CommandWorkload, command_to_data, fill_episode
from testbed.campaign.model import Campaign, Cell, GroupKey, episode_key, fmt_number
from testbed.campaign.schedule_file import schedule_document
from testbed.campaign.workload import Schedule, seed_int
from testbed.net.commands import CommandSpec, parse_ready, substitute
from testbed.net.session import (
    HostNetwork,
    SessionResult,
    addresses_of,
    labels,
    open_host_network,
    run_commands,
)
from testbed.results.history import history_columns, read_program_histories
from testbed.run.contract import EpisodeAborted, EpisodeResult
from testbed.run.episode import link_columns
from testbed.run.metrics import MetricsError, read_metrics

COUNTER_KEYS = ("up_bytes", "down_bytes", "up_packets", "down_packets", "up_drops",
                "down_drops")


def program_seed(campaign_seed: int, template: str) -> int:
    """``TESTBED_SEED``: one per (campaign seed, template), as the schedule."""
    return seed_int("command", campaign_seed, template) % (1 << 63)


def episode_specs(command: CommandWorkload, cell: Cell, schedule: Schedule, *, key: str,
                  seed: int) -> list[tuple[CommandSpec, dict[str, str]]]:
    """The programs of one episode in start order, each with its run's own environment."""
    out = []

    def fill(text: str) -> str:
        return fill_episode(text, policy=cell.policy, episode=key, seed=seed)

    for run in command.runs:
        argv = tuple(fill(a) for a in run.argv)
        env = {name: fill(value) for name, value in (*command.env, *run.env)}
        ready = parse_ready(run.ready) if run.ready is not None else None
        for host in command.hosts_of(run, schedule.agents):
            out.append((CommandSpec(host, argv, run.service, ready), env))
    return out


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _tail(path: Path | None, lines: int = 3) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(t.strip() for t in text)[:400]


def failure_reason(result: SessionResult, timeout_s: float) -> str | None:
    """Why the episode is aborted (rule 4), None if every program ended well."""
    if result.failure:
        failed = next((p for p in result.programs if p.stopped == ""
                       and p.status not in (0, None)), None)
        tail = _tail(failed.stderr) if failed is not None else ""
        return result.failure + (f"; stderr: {tail}" if tail else "")
    if result.timed_out:
        running = [p.label for p in result.programs if p.stopped == "timeout"
                   and not p.service]
        return (f"command timeout after {fmt_number(timeout_s)} s; still running: "
                f"{', '.join(running) or 'none'}")
    for p in result.programs:
        if p.stopped == "" and p.status not in (0, None):
            what = "service" if p.service else "program"
            tail = _tail(p.stderr)
            return (f"{what} {p.label} exited with status {p.status}"
                    + (f"; stderr: {tail}" if tail else ""))
    return None


class CommandGroup:
    """A live topology for the command workload of one group (rule 1)."""

    def __init__(self, net: HostNetwork, campaign: Campaign, commands_dir: Path,
                 link_log_dir: Path | None) -> None:
        assert campaign.command is not None
        self.net = net
        self.campaign = campaign
        self.command: CommandWorkload = campaign.command
        self.commands_dir = commands_dir
        self.link_log_dir = link_log_dir

    @property
    def backend(self) -> str:
        return self.net.topo.backend

    @property
    def description(self) -> Mapping[str, Any]:
        return {**self.net.topo.describe(), "command": command_to_data(self.command)}

    async def run_episode(self, cell: Cell, schedule: Schedule) -> EpisodeResult:
        topo, command = self.net.topo, self.command
        key = episode_key(cell, schedule.template)
        edir = self.commands_dir / key.replace("/", "~")
        await trio.to_thread.run_sync(_fresh_dir, edir)
        seed = program_seed(self.campaign.seed, schedule.template)
        document = schedule_document(schedule, episode=key, unit_ms=command.unit_ms,
                                     lead_ms=command.lead_ms, program_seed=seed)
        schedule_path = edir / "schedule.json"
        await trio.to_thread.run_sync(schedule_path.write_text, json.dumps(document))
        pairs = episode_specs(command, cell, schedule, key=key, seed=seed)
        specs = [spec for spec, _ in pairs]
        names = labels(specs)
        run_env = dict(zip(names, (env for _, env in pairs), strict=True))
        files = {label: (spec.host, edir / f"{label}.metrics.jsonl")
                 for label, spec in zip(names, specs, strict=True)}
        histories = {label: (spec.host, edir / f"{label}.history.jsonl")
                     for label, spec in zip(names, specs, strict=True)}
        common = {"TESTBED_SCHEDULE": str(schedule_path), "TESTBED_EPISODE": key,
                  "TESTBED_SEED": str(seed), "TESTBED_POLICY": cell.policy,
                  "TESTBED_NETWORK": cell.network, "TESTBED_TEMPLATE": schedule.template,
                  "TESTBED_UNIT_MS": fmt_number(command.unit_ms),
                  "TESTBED_KEYS": " ".join(schedule.keys)}

        addresses = addresses_of(topo)

        def env_of(spec: CommandSpec, label: str) -> dict[str, str]:
            owned = [k for k in schedule.keys if schedule.owners.get(k) == spec.host]
            own = {name: substitute((value,), spec.host, addresses)[0]  # {host}, {addr}..
                   for name, value in run_env[label].items()}
            return {**own, **common, "TESTBED_METRICS": str(files[label][1]),
                    "TESTBED_OWNED_KEYS": " ".join(owned),
                    "TESTBED_HISTORY": str(histories[label][1])}

        before: dict[str, dict[str, dict[str, int]]] = {}
        log_dir = (self.link_log_dir / key.replace("/", "~")
                   if self.link_log_dir is not None and topo.links is not None else None)

        async def on_trace_start(_: float) -> None:
            await topo.clear_link_statistics()
            if log_dir is not None:
                await topo.start_link_log(str(log_dir), f"episode {key}")
            before["counters"] = await topo.link_counters()

        timeout_s = min(command.timeout_s, self.campaign.options.episode_timeout_s)
        started = time.monotonic()
        try:
            result = await run_commands(
                topo, specs, hosts_file=self.net.hosts_file, timeout_s=timeout_s,
                output="files", output_dir=edir, env_of=env_of,
                on_trace_start=on_trace_start, cwd=command.cwd)
            after = await topo.link_counters()
            stats = await topo.link_statistics()
        finally:
            if log_dir is not None:
                with trio.CancelScope(shield=True):
                    await topo.stop_link_log()
        reason = failure_reason(result, timeout_s)
        if reason is not None:
            raise EpisodeAborted(reason)
        t0_ns = None if result.t0 is None else int(result.t0 * 1e9)
        try:
            actions, metrics = await trio.to_thread.run_sync(
                lambda: read_metrics(files, t0_ns=t0_ns))
        except MetricsError as exc:
            raise EpisodeAborted(str(exc)) from None
        try:
            texts, judged = await trio.to_thread.run_sync(
                lambda: read_program_histories(histories, relative_to=self.commands_dir))
        except HistoryError as exc:
            raise EpisodeAborted(f"history: {exc}") from None
        episode = self._episode(result, actions, metrics, before.get("counters", {}), after,
                                stats, time.monotonic() - started)
        if judged is not None:
            episode.update(history_columns(judged))
        if log_dir is not None:
            episode["link_log"] = f"links/{log_dir.name}"
        return EpisodeResult(actions=actions, episode=episode, history=texts)

    def _episode(self, result: SessionResult, actions: Sequence[Mapping[str, Any]],
                 metrics: Mapping[str, Any], before: Mapping[str, Mapping[str, int]],
                 after: Mapping[str, Mapping[str, int]], stats: Mapping[str, float],
                 wall_s: float) -> dict[str, Any]:
        per_host = {h: {k: int(after[h].get(k, 0)) - int(before.get(h, {}).get(k, 0))
                        for k in COUNTER_KEYS} for h in after}
        up_bytes = sum(v["up_bytes"] for v in per_host.values())
        stalls = [float(a["stall_ms"]) for a in actions if a.get("stall_ms") is not None]
        n = len(actions)
        programs = [{"label": p.label, "host": p.host, "service": p.service,
                     "status": p.status, "stopped": p.stopped,
                     "wall_s": None if p.ended is None else round(p.ended - p.started, 6)}
                    for p in result.programs]
        return {
            "stall_ms_per_action": sum(stalls) / len(stalls) if stalls else None,
            "stall_action_ms": sum(stalls) if stalls else None,
            "stall_barrier_ms": None, "stall_commit_ms": None,
            "kib_per_action": up_bytes / 1024 / n if n else None,
            "connections": None, "link_bytes": up_bytes, "wall_s": wall_s,
            "congestion_control": str(self.net.topo.describe().get("congestion_control")
                                      or ""),
            "rpc_timeouts": None,
            **link_columns(before, after, stats),
            "link_host_bytes": json.dumps(per_host, sort_keys=True),
            "programs": json.dumps(programs),
            "metrics": json.dumps(metrics, sort_keys=True) if metrics else None,
        }


class CommandRunner:
    """Builds one topology per group for a command workload (the campaign's Runner).

    ``out_dir``: the run directory (``commands/`` holds each episode's schedule, output
    and metrics); ``link_log_dir``: where packet logs go with ``[options] link_log``.
    """

    def __init__(self, campaign: Campaign, *, out_dir: Path, backend: str | None = None,
                 link_log_dir: Path | None = None) -> None:
        if campaign.command is None:
            raise ValueError("CommandRunner: the campaign has no [command] table")
        self.campaign = campaign
        self.backend = backend or campaign.options.backend
        self.commands_dir = Path(out_dir).absolute() / "commands"
        self.link_log_dir = (Path(link_log_dir).absolute()
                             if link_log_dir is not None and campaign.options.link_log
                             else None)
        self.groups: list[CommandGroup] = []

    @asynccontextmanager
    async def open_group(self, key: GroupKey, cells: Sequence[Cell]
                         ) -> AsyncIterator[CommandGroup]:
        assert self.campaign.command is not None
        profile = self.campaign.network_profile(key.network)
        first = self.campaign.schedule(cells[0], self.campaign.templates[0])
        hosts = [*first.agents, *self.campaign.command.hosts]
        async with open_host_network(profile, hosts, backend=self.backend,
                                     trace_offset_s=key.trace_offset_s,
                                     seed=self.campaign.seed,
                                     packet_log=self.link_log_dir is not None) as net:
            group = CommandGroup(net, self.campaign, self.commands_dir, self.link_log_dir)
            self.groups.append(group)
            yield group
