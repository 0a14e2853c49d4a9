"""The ``[command]`` table as typed models (``testbed.campaign.command`` has the format
and the rules; this module checks a table against them).

:class:`CommandTable` and :class:`RunTable` validate a table and give its JSON Schema
(``testbed schema command``); :func:`parse_command` turns a valid one into a
:class:`CommandWorkload`, or raises one :class:`CommandTableError` line naming the field
by its path (``command.run[1].on``). Which hosts a run may name depends on the cell (the
grid's smallest ``agents``), so it travels in the validation context.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from testbed.campaign.command import (
    COMMAND_KIND,
    DEFAULT_LEAD_MS,
    DEFAULT_NAME,
    DEFAULT_TIMEOUT_S,
    DEFAULT_UNIT_MS,
    ON_GROUPS,
    PLACEHOLDERS,
    RESERVED_PREFIX,
    CommandTableError,
    CommandWorkload,
    Run,
)
from testbed.campaign.fields import (
    BOOL,
    HERE,
    NUMBER_GE0,
    NUMBER_GT0,
    STRING,
    STRINGS,
    Check,
    Table,
    bad,
    context,
    first_problem,
    flag,
    message_of,
    not_allowed,
    number,
    whole,
)

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AGENT = re.compile(r"^a(\d+)$")
_ADDR = re.compile(r"\{addr:([^{}]*)\}")
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")
MAX_TIMEOUT_S = 86400.0
MAX_MS = 3_600_000.0
READY_ALLOWED = "tcp:PORT or udp:PORT (PORT 1..65535), or delay:SECONDS (0..3600)"
_ENV_SCHEMA = {"type": "object", "additionalProperties": {"type": ["string", "number"]}}


def _fail(where: str, value: Any, allowed: str) -> CommandTableError:
    return CommandTableError(f"{where}: {value!r} is not allowed; allowed: {allowed}")


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


def ready_text(text: Any) -> str | None:
    """A readiness check normalised (``tcp:7000``, ``delay:1.5``); None if it is none."""
    kind, _, value = text.partition(":") if isinstance(text, str) else ("", "", "")
    try:
        if kind in ("tcp", "udp") and 1 <= int(value) <= 65535:
            return f"{kind}:{int(value)}"
        if kind == "delay" and math.isfinite(float(value)) and 0 <= float(value) <= 3600:
            return f"delay:{float(value):g}"
    except ValueError:
        pass
    return None


def check_ready(text: Any, where: str) -> str:
    """A readiness check as ``testbed.net.commands.parse_ready`` reads it (the run stage
    turns it into one; campaigns are checked here, below the network stage), normalised."""
    ready = ready_text(text)
    if ready is None:
        raise _fail(where, text, READY_ALLOWED)
    return ready


# --- field checks (the context's "known": the hosts a run may name) -----------------------


def _known(info: ValidationInfo) -> list[str]:
    ctx = context(info)
    hosts = info.data.get("hosts", ()) if ctx.get("table") else ()
    return [*ctx.get("known", ()), *(hosts or ())]


def _label(value: Any) -> str:
    if isinstance(value, str) and _LABEL.match(value):
        return value
    raise bad(f"{value!r} is not allowed; allowed: 1-64 letters, digits, '_', '.', '-' "
              "(starting with a letter or digit)")


def _hosts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise bad(f"{value!r} is not allowed; allowed: a list of host names, e.g. "
                  '["server"]')
    for host in value:
        if not isinstance(host, str) or not _HOST.match(host) or _AGENT.match(host) \
                or host in ("central", *ON_GROUPS):
            raise bad(f"{host!r} is not allowed; allowed: names of 1-32 letters, digits "
                      "or _ (not a<N>, which name agents, nor central, agents or all)")
    if len(set(value)) != len(value):
        raise bad(f"{value!r} is not allowed; allowed: each host once")
    return tuple(value)


def _placeholders(text: str, known: Sequence[str]) -> str | None:
    """What is wrong with the braces of an env value (the rule 3 of
    ``testbed.campaign.command``), after its path; None if nothing."""
    for match in _BRACED.finditer(text):
        name, host = match.group(1), match.group(2)
        if name == "addr" and host is not None:
            if host not in known:
                return f": {{addr:{host}}}: {host!r} is not allowed; allowed: a host " \
                       f"({', '.join(known)})"
        elif host is not None or f"{{{name}}}" not in PLACEHOLDERS:
            return f": {match.group(0)!r} is not a placeholder; allowed: " \
                   f"{', '.join(PLACEHOLDERS)}"
    return None


def _env(value: Any, info: ValidationInfo) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise bad(f"{value!r} is not allowed; allowed: a table of strings, e.g. "
                  '{ MODE = "fast" }')
    known = _known(info)
    out = []
    for key, item in value.items():
        where = f"{HERE}.{key}"
        if not _ENV.match(str(key)) or str(key).startswith(RESERVED_PREFIX):
            raise bad(f"{where}: {key!r} is not allowed; allowed: a variable name of "
                      f"letters, digits and _ (names starting {RESERVED_PREFIX} are the "
                      "testbed's)")
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise bad(f"{where}: {item!r} is not allowed; allowed: a string or a number")
        problem = _placeholders(str(item), known)
        if problem is not None:
            raise bad(where + problem)
        out.append((str(key), str(item)))
    return tuple(out)


def _on(value: Any, info: ValidationInfo) -> tuple[str, ...]:
    known = _known(info)
    allowed = f"{', '.join(ON_GROUPS)}, a host ({', '.join(known)}) or a list of hosts"
    if isinstance(value, str) and value in ON_GROUPS:
        return (value,)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise not_allowed(value, allowed)
    for name in names:
        if name not in known:
            raise not_allowed(name, allowed)
    if len(set(names)) != len(names):
        raise not_allowed(value, "each host once")
    return tuple(names)


def _argv(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) \
            or not value[0]:
        raise bad(f"{value!r} is not allowed; allowed: a non-empty list of strings, e.g. "
                  '["python3", "a.py"]')
    return tuple(value)


def _cmd(value: Any) -> tuple[str, ...]:
    try:
        argv = shlex.split(value) if isinstance(value, str) else []
    except ValueError as exc:
        raise bad(f"{value!r} is not allowed; allowed: a command line ({exc})") from None
    if not argv:
        raise bad(f"{value!r} is not allowed; allowed: a non-empty command line, e.g. "
                  '"python3 a.py"')
    return tuple(argv)


def _ready(value: Any) -> str:
    ready = ready_text(value)
    if ready is None:
        raise bad(f"{value!r} is not allowed; allowed: {READY_ALLOWED}")
    return ready


def _cwd(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    raise bad(f"{value!r} is not allowed; allowed: a directory (relative to the campaign "
              "file)")


class RunTable(Table):
    """One ``[[command.run]]``: a program started on some hosts, in file order."""

    written: ClassVar[str] = "a table ([[command.run]])"
    on: Annotated[Any, Check(_on, {"anyOf": [STRING, STRINGS], "description":
                                   "agents, all, a host or a list of hosts"},
                             with_info=True)] = None
    argv: Annotated[Any, Check(_argv, {**STRINGS, "minItems": 1})] = None
    cmd: Annotated[Any, Check(_cmd, {**STRING, "description": "a command line, split as a "
                                     "shell would (or argv)"})] = None
    service: Annotated[Any, Check(flag("true or false"), BOOL)] = None
    ready: Annotated[Any, Check(_ready, {**STRING, "pattern": "^(tcp|udp|delay):",
                                         "description": READY_ALLOWED})] = None
    env: Annotated[Any, Check(_env, _ENV_SCHEMA, with_info=True)] = None

    def run(self, known: Sequence[str]) -> Run:
        """The run (the checks across its fields)."""
        if self.on is None:
            raise bad(f"{HERE}.on: missing; name the host(s): "
                      f"{', '.join((*ON_GROUPS, *known))}")
        if (self.argv is None) == (self.cmd is None):
            raise bad(f"{HERE}: give the command as argv = [...] or as cmd = \"...\" (one "
                      "of them)")
        argv = self.argv if self.argv is not None else self.cmd
        for arg in argv:
            for name in _ADDR.findall(arg):
                if name not in known:
                    raise bad(f"{HERE}: {{addr:{name}}}: {name!r} is not allowed; allowed: "
                              f"a host ({', '.join(known)})")
        return Run(on=self.on, argv=argv, service=bool(self.service), ready=self.ready,
                   env=self.env or ())


def _runs(value: Any, info: ValidationInfo) -> tuple[Run, ...]:
    if not isinstance(value, list) or not value:
        raise bad("missing; add at least one [[command.run]] with on and argv")
    known = _known(info)
    runs = []
    for i, raw in enumerate(value):
        where = f"command.run[{i}]"
        try:
            runs.append(RunTable.model_validate(raw, context={"known": known}).run(known))
        except ValidationError as exc:
            raise whole(first_problem(exc, where)) from None
        except PydanticCustomError as exc:
            raise whole(message_of(exc, where)) from None
    if all(r.service for r in runs):
        raise bad("every run is a service; at least one must run to its end (an episode "
                  "ends when those have exited)")
    return tuple(runs)


def _at_most(high: float, *, zero: bool = False) -> Check:
    allowed = f"a number {'>=' if zero else '>'} 0 and <= {high:g}"
    schema = {**(NUMBER_GE0 if zero else NUMBER_GT0), "maximum": high}
    return Check(number(allowed, lo=0, lo_open=not zero, hi=high), schema)


class CommandTable(Table):
    """``[command]``: the programs a kind = "command" campaign runs in every episode
    (docs/own-programs.md)."""

    written: ClassVar[str] = 'a [command] table with [[command.run]] entries (kind = "command")'
    name: Annotated[Any, Check(_label, {**STRING, "pattern": _LABEL.pattern})] = None
    hosts: Annotated[Any, Check(_hosts, {**STRINGS, "uniqueItems": True})] = None
    timeout_s: Annotated[Any, _at_most(MAX_TIMEOUT_S)] = None
    unit_ms: Annotated[Any, _at_most(MAX_MS)] = None
    lead_ms: Annotated[Any, _at_most(MAX_MS, zero=True)] = None
    env: Annotated[Any, Check(_env, _ENV_SCHEMA, with_info=True)] = None
    cwd: Annotated[Any, Check(_cwd, STRING)] = None
    run: Annotated[Any, Check(_runs, {"type": "array", "minItems": 1, "items":
                                      RunTable.model_json_schema()}, with_info=True)] = None


TABLE_FIELDS = tuple(CommandTable.model_fields)
RUN_FIELDS = tuple(RunTable.model_fields)


def parse_command(value: Any, *, agents: int, base_dir: Path | None) -> CommandWorkload:
    """The ``[command]`` table of a campaign whose cells have at least AGENTS agents."""
    known = [f"a{i}" for i in range(agents)]
    try:
        table = CommandTable.model_validate(value, context={"known": known, "table": True})
    except ValidationError as exc:
        raise CommandTableError(first_problem(exc, "command")) from None
    if table.run is None:
        raise CommandTableError("command.run: missing; add at least one [[command.run]] "
                                "with on and argv")
    cwd: str | None = str(base_dir) if base_dir is not None else None
    if table.cwd is not None:
        path = Path(table.cwd) if Path(table.cwd).is_absolute() or base_dir is None \
            else base_dir / table.cwd
        if base_dir is not None and not path.is_dir():
            raise _fail("command.cwd", table.cwd, f"an existing directory (no {path})")
        cwd = str(path.resolve()) if base_dir is not None else table.cwd
    return CommandWorkload(
        runs=table.run, name=table.name or DEFAULT_NAME, hosts=table.hosts or (),
        timeout_s=DEFAULT_TIMEOUT_S if table.timeout_s is None else table.timeout_s,
        unit_ms=DEFAULT_UNIT_MS if table.unit_ms is None else table.unit_ms,
        lead_ms=DEFAULT_LEAD_MS if table.lead_ms is None else table.lead_ms,
        env=table.env or (), cwd=cwd, source_cwd=table.cwd)


def command_schema() -> dict[str, Any]:
    """The JSON Schema of a ``[command]`` table, with the defaults of the fields left out."""
    schema = CommandTable.model_json_schema()
    for name, value in (("name", DEFAULT_NAME), ("timeout_s", DEFAULT_TIMEOUT_S),
                        ("unit_ms", DEFAULT_UNIT_MS), ("lead_ms", DEFAULT_LEAD_MS)):
        schema["properties"][name]["default"] = value
    return schema
