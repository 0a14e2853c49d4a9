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

1. The table is checked completely before anything runs; each failure is one
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

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AGENT = re.compile(r"^a(\d+)$")
_ADDR = re.compile(r"\{addr:([^{}]*)\}")
RESERVED_PREFIX = "TESTBED_"
#: What ``argv`` and ``env`` values may hold in braces (rule 3): the episode's, then those
#: of ``testbed.net.commands``.
PLACEHOLDERS = ("{policy}", "{episode}", "{seed}", "{host}", "{addr}", "{addr:NAME}",
                "{hosts}")
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")


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


def _fail(where: str, value: Any, allowed: str) -> CommandTableError:
    return CommandTableError(f"{where}: {value!r} is not allowed; allowed: {allowed}")


def _env(value: Any, where: str, known: Sequence[str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise _fail(where, value, 'a table of strings, e.g. { MODE = "fast" }')
    out = []
    for key, item in value.items():
        if not _ENV.match(str(key)) or str(key).startswith(RESERVED_PREFIX):
            raise _fail(f"{where}.{key}", key, "a variable name of letters, digits and _ "
                        f"(names starting {RESERVED_PREFIX} are the testbed's)")
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise _fail(f"{where}.{key}", item, "a string or a number")
        _check_placeholders(str(item), f"{where}.{key}", known)
        out.append((str(key), str(item)))
    return tuple(out)


def _check_placeholders(text: str, where: str, known: Sequence[str]) -> None:
    """Every ``{name}`` in an env value is a placeholder (rule 3)."""
    for match in _BRACED.finditer(text):
        name, host = match.group(1), match.group(2)
        if name == "addr" and host is not None:
            if host not in known:
                raise _fail(f"{where}: {{addr:{host}}}", host, f"a host ({', '.join(known)})")
        elif host is not None or f"{{{name}}}" not in PLACEHOLDERS:
            raise CommandTableError(f"{where}: {match.group(0)!r} is not a placeholder; "
                                    f"allowed: {', '.join(PLACEHOLDERS)}")


def fill_episode(text: str, *, policy: str, episode: str, seed: int) -> str:
    """TEXT (an argument or env value) with the episode's placeholders filled in (rule 3;
    those of hosts are filled per host when the program starts)."""
    return text.replace("{policy}", policy).replace("{episode}", episode) \
        .replace("{seed}", str(seed))


def _number(table: Mapping[str, Any], key: str, default: float, high: float, *,
            zero: bool = False) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or not (value >= 0 if zero else value > 0) \
            or value > high:
        raise _fail(f"command.{key}", value, f"a number {'>=' if zero else '>'} 0 and <= "
                    f"{high:g}")
    return float(value)


def _argv(run: Mapping[str, Any], where: str) -> tuple[str, ...]:
    if ("argv" in run) == ("cmd" in run):
        raise CommandTableError(f"{where}: give the command as argv = [...] or as "
                                "cmd = \"...\" (one of them)")
    if "cmd" in run:
        text = run["cmd"]
        try:
            argv = shlex.split(text) if isinstance(text, str) else []
        except ValueError as exc:
            raise _fail(f"{where}.cmd", text, f"a command line ({exc})") from None
        if not argv:
            raise _fail(f"{where}.cmd", text, 'a non-empty command line, e.g. "python3 a.py"')
        return tuple(argv)
    value = run["argv"]
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) \
            or not value[0]:
        raise _fail(f"{where}.argv", value, 'a non-empty list of strings, e.g. ["python3", '
                    '"a.py"]')
    return tuple(value)


def _on(value: Any, where: str, known: Sequence[str]) -> tuple[str, ...]:
    allowed = f"{', '.join(ON_GROUPS)}, a host ({', '.join(known)}) or a list of hosts"
    if isinstance(value, str) and value in ON_GROUPS:
        return (value,)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise _fail(where, value, allowed)
    for name in names:
        if name not in known:
            raise _fail(where, name, allowed)
    if len(set(names)) != len(names):
        raise _fail(where, value, "each host once")
    return tuple(names)


def check_label(value: Any, where: str) -> str:
    """A label: the command's name, or a ``policy`` of a command campaign's grid (the
    variants of the program it compares; ``{policy}``, ``TESTBED_POLICY``)."""
    if not isinstance(value, str) or not _LABEL.match(value):
        raise _fail(where, value, "1-64 letters, digits, '_', '.', '-' (starting with a "
                    "letter or digit)")
    return value


def default_label(value: Any, kind: str) -> str | None:
    """The grid's default policy of a command campaign (its command's name); None for
    other kinds, which may not have a ``[command]`` table."""
    if kind != COMMAND_KIND:
        if value is not None:
            raise CommandTableError(f"command: only for kind = \"{COMMAND_KIND}\" campaigns; "
                                    f"this campaign's kind is {kind!r}")
        return None
    if not isinstance(value, Mapping):
        raise CommandTableError("command: missing; a kind = \"command\" campaign needs a "
                                "[command] table with [[command.run]] entries")
    return check_label(value.get("name", DEFAULT_NAME), "command.name")


def parse_command(value: Any, *, agents: int, base_dir: Path | None) -> CommandWorkload:
    """The ``[command]`` table of a campaign whose cells have at least AGENTS agents."""
    if not isinstance(value, Mapping):
        raise CommandTableError("command: expected a [command] table with [[command.run]] "
                                "entries (kind = \"command\")")
    unknown = [k for k in value if k not in TABLE_FIELDS]
    if unknown:
        raise CommandTableError(f"command: unknown field {unknown[0]!r}; allowed: "
                                f"{', '.join(TABLE_FIELDS)}")
    name = check_label(value.get("name", DEFAULT_NAME), "command.name")
    extra = value.get("hosts", [])
    if not isinstance(extra, list):
        raise _fail("command.hosts", extra, 'a list of host names, e.g. ["server"]')
    for host in extra:
        if not isinstance(host, str) or not _HOST.match(host) or _AGENT.match(host) \
                or host in ("central", *ON_GROUPS):
            raise _fail("command.hosts", host, "names of 1-32 letters, digits or _ (not "
                        "a<N>, which name agents, nor central, agents or all)")
    if len(set(extra)) != len(extra):
        raise _fail("command.hosts", extra, "each host once")
    known = [f"a{i}" for i in range(agents)] + list(extra)
    raw_runs = value.get("run")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise CommandTableError("command.run: missing; add at least one [[command.run]] "
                                "with on and argv")
    runs = tuple(_run(raw, f"command.run[{i}]", known) for i, raw in enumerate(raw_runs))
    if all(r.service for r in runs):
        raise CommandTableError("command.run: every run is a service; at least one must run "
                                "to its end (an episode ends when those have exited)")
    cwd_text = value.get("cwd")
    cwd: str | None = str(base_dir) if base_dir is not None else None
    if cwd_text is not None:
        if not isinstance(cwd_text, str) or not cwd_text:
            raise _fail("command.cwd", cwd_text, "a directory (relative to the campaign file)")
        path = Path(cwd_text) if Path(cwd_text).is_absolute() or base_dir is None \
            else base_dir / cwd_text
        if base_dir is not None and not path.is_dir():
            raise _fail("command.cwd", cwd_text, f"an existing directory (no {path})")
        cwd = str(path.resolve()) if base_dir is not None else cwd_text
    return CommandWorkload(
        runs=runs, name=name, hosts=tuple(extra),
        timeout_s=_number(value, "timeout_s", DEFAULT_TIMEOUT_S, 86400.0),
        unit_ms=_number(value, "unit_ms", DEFAULT_UNIT_MS, 3_600_000.0),
        lead_ms=_number(value, "lead_ms", DEFAULT_LEAD_MS, 3_600_000.0, zero=True),
        env=_env(value.get("env", {}), "command.env", known), cwd=cwd, source_cwd=cwd_text)


def _run(raw: Any, where: str, known: Sequence[str]) -> Run:
    if not isinstance(raw, Mapping):
        raise CommandTableError(f"{where}: expected a table ([[command.run]])")
    unknown = [k for k in raw if k not in RUN_FIELDS]
    if unknown:
        raise CommandTableError(f"{where}: unknown field {unknown[0]!r}; allowed: "
                                f"{', '.join(RUN_FIELDS)}")
    if "on" not in raw:
        raise CommandTableError(f"{where}.on: missing; name the host(s): "
                                f"{', '.join((*ON_GROUPS, *known))}")
    on = _on(raw["on"], f"{where}.on", known)
    argv = _argv(raw, where)
    for arg in argv:
        for name in _ADDR.findall(arg):
            if name not in known:
                raise _fail(f"{where}: {{addr:{name}}}", name, f"a host ({', '.join(known)})")
    service = raw.get("service", False)
    if not isinstance(service, bool):
        raise _fail(f"{where}.service", service, "true or false")
    ready = check_ready(raw["ready"], f"{where}.ready") if "ready" in raw else None
    return Run(on=on, argv=argv, service=service, ready=ready,
               env=_env(raw.get("env", {}), f"{where}.env", known))


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


def check_ready(text: Any, where: str) -> str:
    """A readiness check as ``testbed.net.commands.parse_ready`` reads it (the run stage
    turns it into one; campaigns are checked here, below the network stage), normalised."""
    allowed = "tcp:PORT or udp:PORT (PORT 1..65535), or delay:SECONDS (0..3600)"
    kind, _, value = text.partition(":") if isinstance(text, str) else ("", "", "")
    try:
        if kind in ("tcp", "udp") and 1 <= int(value) <= 65535:
            return f"{kind}:{int(value)}"
        if kind == "delay" and math.isfinite(float(value)) and 0 <= float(value) <= 3600:
            return f"delay:{float(value):g}"
    except ValueError:
        pass
    raise _fail(where, text, allowed)
