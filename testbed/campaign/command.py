"""Command workloads: a campaign's ``[command]`` table, your own programs per host (pure).

A campaign of ``kind = "command"`` runs, in every episode, the programs its
``[command]`` table lists on the hosts of the cell's network, instead of the testbed's
node processes. The format (docs/own-programs.md)::

    [command]
    name = "kv"                       # a label (the default grid policy); default "command"
    hosts = ["server"]                # hosts beyond the agents a0..a<agents-1>
    timeout_s = 120                   # per episode; then everything is stopped, aborted
    unit_ms = 100                     # schedule time of one work unit
    lead_ms = 1000                    # unit 0 is this long after replay time 0
    env = { MODE = "fast" }           # for every program

    [[command.run]]                   # started in this order
    on = "server"                     # a host, a list of hosts, "agents" or "all"
    argv = ["python3", "server.py"]   # or cmd = "python3 server.py" (split like a shell)
    service = true                    # stopped when the others have ended
    ready = "tcp:7000"                # tcp:PORT, udp:PORT or delay:SECONDS

Rules:

1. The table is checked completely before anything runs
   (``testbed.campaign.command_table``, typed models); each failure is one
   :class:`CommandTableError` line naming the field by its path (``command.run[1].on``)
   and what is allowed. Hosts named by ``on`` must exist in every cell (agents by name,
   ``a0``.. below the grid's smallest ``agents``, or ``command.hosts``).
2. At least one run is not a service (an episode ends when those have exited).
3. Placeholders of ``testbed.net.commands`` (``{host}``, ``{addr}``, ``{addr:NAME}``,
   ``{hosts}``) work in ``argv`` and in ``env`` values, and so do ``{policy}``,
   ``{episode}`` and ``{seed}`` (:data:`PLACEHOLDERS`); relative paths start in ``cwd``
   (default: the campaign file's folder). In ``argv`` other text in braces is left alone
   (``awk '{print $1}'``); in an ``env`` value a ``{name}`` that is no placeholder is
   refused in one line listing them (it would reach the program literally).
4. :func:`command_to_data` writes the spec back as a table that parses to an equal spec
   (the manifest's config, ``--resume``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.errors import UserError

COMMAND_KIND = "command"
TABLE_FIELDS = ("name", "hosts", "timeout_s", "unit_ms", "lead_ms", "env", "cwd", "run")
RUN_FIELDS = ("on", "argv", "cmd", "service", "ready", "env")
ON_GROUPS = ("agents", "all")
DEFAULT_NAME = "command"
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_UNIT_MS = 100.0
DEFAULT_LEAD_MS = 1000.0
RESERVED_PREFIX = "TESTBED_"
#: What ``argv`` and ``env`` values may hold in braces (rule 3): the episode's, then those
#: of ``testbed.net.commands``.
PLACEHOLDERS = ("{policy}", "{episode}", "{seed}", "{host}", "{addr}", "{addr:NAME}",
                "{hosts}")


class CommandTableError(UserError):
    """A ``[command]`` table is wrong (one line naming the field)."""


@dataclass(frozen=True)
class Run:
    """One ``[[command.run]]``: a command on some hosts."""

    on: tuple[str, ...]  # host names, or ("agents",) / ("all",)
    argv: tuple[str, ...]
    service: bool = False
    ready: str | None = None  # tcp:PORT, udp:PORT or delay:SECONDS (normalised)
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CommandWorkload:
    """A validated ``[command]`` table."""

    runs: tuple[Run, ...]
    name: str = DEFAULT_NAME
    hosts: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    unit_ms: float = DEFAULT_UNIT_MS
    lead_ms: float = DEFAULT_LEAD_MS
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None  # absolute; None: the current directory
    source_cwd: str | None = field(default=None, compare=False)  # as written

    def hosts_of(self, run: Run, agents: Sequence[str]) -> list[str]:
        """The hosts RUN starts on, in a cell with these AGENTS."""
        if run.on == ("agents",):
            return list(agents)
        if run.on == ("all",):
            return [*agents, *self.hosts]
        return list(run.on)


def fill_episode(text: str, *, policy: str, episode: str, seed: int) -> str:
    """TEXT (an argument or env value) with the episode's placeholders filled in (rule 3;
    those of hosts are filled per host when the program starts)."""
    return text.replace("{policy}", policy).replace("{episode}", episode) \
        .replace("{seed}", str(seed))


def command_to_data(spec: CommandWorkload) -> dict[str, Any]:
    """Rule 4."""
    runs = []
    for run in spec.runs:
        item: dict[str, Any] = {"on": run.on[0] if len(run.on) == 1 else list(run.on),
                                "argv": list(run.argv)}
        if run.service:
            item["service"] = True
        if run.ready is not None:
            item["ready"] = run.ready
        if run.env:
            item["env"] = dict(run.env)
        runs.append(item)
    out: dict[str, Any] = {"name": spec.name, "hosts": list(spec.hosts),
                           "timeout_s": spec.timeout_s, "unit_ms": spec.unit_ms,
                           "lead_ms": spec.lead_ms, "run": runs}
    if spec.env:
        out["env"] = dict(spec.env)
    if spec.cwd is not None:
        out["cwd"] = spec.cwd
    return out
