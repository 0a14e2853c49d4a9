"""Users' commands on the emulated network, as data (pure: nothing runs here).

Rules:

1. A :class:`CommandSpec` is one command on one host: its argument vector, whether it
   is a ``service`` (started first and stopped once the other commands have ended; its
   status counts only if it ends by itself with a failure), and an optional readiness
   check (:class:`Readiness`: a TCP or UDP port the command listens on, or a delay)
   that must pass before the next command starts. Commands start in the order given.
2. Placeholders in arguments: ``{host}`` (the host's name), ``{addr}`` (its IPv4
   address), ``{addr:NAME}`` (host NAME's address), ``{hosts}`` (every host's name,
   space-separated). Any other text in braces is left alone (``awk '{print $1}'``
   works); ``{addr:NAME}`` of a host that does not exist is a one-line error.
3. Every command's environment names the network: ``TESTBED_HOST``, ``TESTBED_ADDR``,
   ``TESTBED_HOSTS`` (names, space-separated) and ``TESTBED_ADDR_<NAME>`` per host
   (upper case), plus ``TESTBED_T0_NS`` (CLOCK_MONOTONIC nanoseconds at replay time 0
   of the traces, set when the trace restarts).
4. Each host sees a hosts file of its own run (:func:`hosts_file_text`): ``localhost``
   and every host's name, so names resolve inside the namespaces without DNS.
5. ``testbed exec`` arguments after the options are either ``-- COMMAND...`` (every
   selected host) or one or more ``--on HOST [--service] [--ready SPEC] -- COMMAND...``
   segments; a segment's command ends where the next ``--on`` begins
   (:func:`split_segments`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.errors import UserError

HOST_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_PLACEHOLDER = re.compile(r"\{(host|addr|hosts|addr:([^{}]*))\}")
READY_KINDS = ("tcp", "udp", "delay")
MAX_READY_DELAY_S = 3600.0


class CommandError(UserError):
    """A command, host selection or readiness check is not usable (one line)."""


@dataclass(frozen=True)
class Readiness:
    """What shows a command is ready: a listening port (``tcp``/``udp``) or a delay."""

    kind: str
    port: int = 0
    delay_s: float = 0.0

    def describe(self) -> str:
        return f"delay:{self.delay_s:g}" if self.kind == "delay" else f"{self.kind}:{self.port}"


@dataclass(frozen=True)
class CommandSpec:
    """One command on one host (rule 1)."""

    host: str
    argv: tuple[str, ...]
    service: bool = False
    ready: Readiness | None = None


def parse_ready(text: object, where: str = "--ready") -> Readiness:
    """``tcp:PORT``, ``udp:PORT`` or ``delay:SECONDS``."""
    allowed = "tcp:PORT or udp:PORT (PORT 1..65535), or delay:SECONDS (0..3600)"
    if not isinstance(text, str) or ":" not in text:
        raise CommandError(f"{where}: {text!r} is not allowed; allowed: {allowed}")
    kind, _, value = text.partition(":")
    try:
        if kind in ("tcp", "udp"):
            port = int(value)
            if 1 <= port <= 65535:
                return Readiness(kind, port=port)
        elif kind == "delay":
            delay = float(value)
            if math.isfinite(delay) and 0 <= delay <= MAX_READY_DELAY_S:
                return Readiness(kind, delay_s=delay)
    except ValueError:
        pass
    raise CommandError(f"{where}: {text!r} is not allowed; allowed: {allowed}")


def check_host_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not HOST_NAME.match(name):
        raise CommandError(f"{where}: {name!r} is not allowed; allowed: 1-32 letters, "
                           "digits or _")
    return name


def referenced_hosts(argv: Sequence[str]) -> list[str]:
    """Host names that ``{addr:NAME}`` placeholders refer to, in order of appearance."""
    names: list[str] = []
    for arg in argv:
        for match in _PLACEHOLDER.finditer(arg):
            if match.group(2) is not None and match.group(2) not in names:
                names.append(match.group(2))
    return names


def substitute(argv: Sequence[str], host: str, addresses: Mapping[str, str]) -> tuple[str, ...]:
    """ARGV with the placeholders of rule 2 replaced for HOST."""
    def one(match: re.Match[str]) -> str:
        what, other = match.group(1), match.group(2)
        if what == "host":
            return host
        if what == "addr":
            return addresses[host]
        if what == "hosts":
            return " ".join(addresses)
        if other not in addresses:
            raise CommandError(f"{{addr:{other}}}: no host {other!r} in this network; "
                               f"hosts: {', '.join(addresses)}")
        return addresses[other]

    return tuple(_PLACEHOLDER.sub(one, arg) for arg in argv)


def host_env(host: str, addresses: Mapping[str, str], *, t0_ns: int | None = None
             ) -> dict[str, str]:
    """The environment variables of rule 3 for a command on HOST."""
    env = {"TESTBED_HOST": host, "TESTBED_ADDR": addresses[host],
           "TESTBED_HOSTS": " ".join(addresses)}
    env.update({f"TESTBED_ADDR_{name.upper()}": addr for name, addr in addresses.items()})
    if t0_ns is not None:
        env["TESTBED_T0_NS"] = str(t0_ns)
    return env


def hosts_file_text(addresses: Mapping[str, str]) -> str:
    """The /etc/hosts every host of a run sees (rule 4)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{addr}\t{name}" for name, addr in addresses.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Segment:
    """One ``--on HOST ... -- COMMAND`` segment, or (host None) a bare ``-- COMMAND``."""

    host: str | None
    argv: tuple[str, ...]
    service: bool = False
    ready: Readiness | None = None


def split_segments(args: Sequence[str]) -> tuple[list[str], list[Segment]]:
    """Options before the commands, and the commands (rule 5)."""
    args = list(args)
    starts = [i for i, a in enumerate(args) if a in ("--", "--on")]
    if not starts:
        return args, []
    options, rest = args[:starts[0]], args[starts[0]:]
    if rest[0] == "--":
        if not rest[1:]:
            raise CommandError("--: give a command after --")
        return options, [Segment(None, tuple(rest[1:]))]
    segments: list[Segment] = []
    while rest:
        if rest[0] != "--on" or len(rest) < 2:
            raise CommandError("--on: expected --on HOST [--service] [--ready SPEC] -- COMMAND")
        host = check_host_name(rest[1], "--on")
        i, service, ready = 2, False, None
        while i < len(rest) and rest[i] != "--":
            if rest[i] == "--service":
                service, i = True, i + 1
            elif rest[i] == "--ready" and i + 1 < len(rest):
                ready, i = parse_ready(rest[i + 1], f"--on {host} --ready"), i + 2
            else:
                raise CommandError(f"--on {host}: {rest[i]!r} is not allowed here; allowed: "
                                   "--service, --ready SPEC, then -- COMMAND")
        nxt = next((j for j in range(i + 1, len(rest)) if rest[j] == "--on"), len(rest))
        command = tuple(rest[i + 1:nxt])
        if i >= len(rest) or not command:
            raise CommandError(f"--on {host}: give a command after --")
        segments.append(Segment(host, command, service, ready))
        rest = rest[nxt:]
    return options, segments


def plan_commands(segments: Sequence[Segment], hosts: Sequence[str]) -> list[CommandSpec]:
    """The commands the segments ask for on the selected HOSTS (a bare ``--`` runs on
    every one of them)."""
    if not segments:
        raise CommandError("command: missing; give -- COMMAND or --on HOST -- COMMAND")
    specs: list[CommandSpec] = []
    for seg in segments:
        targets = list(hosts) if seg.host is None else [seg.host]
        for host in targets:
            if host not in hosts:
                raise CommandError(f"--on {host}: no such host; hosts: {', '.join(hosts)}")
            specs.append(CommandSpec(host, seg.argv, seg.service, seg.ready))
    for spec in specs:
        missing = [h for h in referenced_hosts(spec.argv) if h not in hosts]
        if missing:
            raise CommandError(f"{{addr:{missing[0]}}}: no host {missing[0]!r} in this "
                               f"network; hosts: {', '.join(hosts)}")
    if all(s.service for s in specs):
        raise CommandError("--service: every command is a service; at least one must run "
                           "to its end")
    return specs


def default_hosts(segments: Sequence[Segment], count: int = 2) -> list[str]:
    """Hosts when none are selected: those the segments name (``--on`` and
    ``{addr:NAME}``, in order of appearance), else ``a0``..``a<count-1>``."""
    names: list[str] = []
    for seg in segments:
        for name in ([seg.host] if seg.host else []) + referenced_hosts(seg.argv):
            check_host_name(name, "host")
            if name not in names:
                names.append(name)
    return names or [f"a{i}" for i in range(count)]
