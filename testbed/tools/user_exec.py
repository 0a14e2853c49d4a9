"""``testbed exec`` and ``testbed shell``: your own programs on an emulated network.

Rules:

1. The network is a registered one (with ``--delay-ms`` / ``--rate-kbit`` overrides as
   ``get_profile`` takes them) or one a campaign file defines (``--campaign FILE``,
   per-host links included); ``--unshaped HOST`` gives a host no link at all (no
   delay, no rate, no loss: a server "on the internet", outside Mahimahi's shells) and
   ``--cc [HOST=]ALG`` sets the TCP congestion control of the network or of one host.
2. Hosts: ``--hosts N`` (``a0``..), ``--host NAME`` (repeatable), else those the
   commands name (``--on HOST``, ``{addr:HOST}``), else the hosts of the campaign's
   first cell on that network, else ``a0`` and ``a1``. ``{addr:HOST}`` adds a host
   only where the commands name them all (``--on`` segments, no ``--campaign``
   hosts); where the hosts are given otherwise (``--hosts``, ``--host``, the
   campaign's, ``a0`` and ``a1`` for a bare ``--``) a placeholder naming none of them
   (nor an ``--on`` host) is a one-line error, never a new idle host. The shell runs on
   ``--on HOST`` or the first host.
3. Everything is built before the first command starts and removed after the last one
   ended, on Ctrl-C and on SIGTERM (``testbed.net.topology``); after a SIGKILL of the
   controller the launchers stop the programs and ``testbed clean`` removes the rest.
4. Output: one command writes to this terminal as it runs; several are captured per
   program and printed, program by program, when they have ended (``--stream``: live,
   each line prefixed with ``[label]``; ``--output DIR``: into ``DIR/<label>.out`` and
   ``.err``). The exit status is the session's (``testbed.net.session`` rule 5).
5. With ``TESTBED_EXEC_TIMINGS=FILE`` the phases of the run (wall-clock nanoseconds and
   this process's CPU seconds: command line entered, network built, first command
   started, commands ended, everything removed) are written to FILE as JSON, for
   ``testbed bench exec``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from testbed.errors import UserError
from testbed.links.linkspec import LinkSpec, NetworkProfile, check_congestion_control
from testbed.links.profiles import get_profile
from testbed.net.capacity import host_limit
from testbed.net.commands import (
    CommandError,
    CommandSpec,
    Segment,
    check_host_name,
    default_hosts,
    plan_commands,
    referenced_hosts,
)
from testbed.net.session import (
    HostNetwork,
    SessionResult,
    addresses_of,
    open_host_network,
    run_commands,
)


@dataclass(frozen=True)
class NetworkChoice:
    """What network to build, as the command line asked (rule 1)."""

    name: str
    campaign: str | None = None
    delay_ms: float | None = None
    rate_kbit: float | None = None
    unshaped: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    backend: str = "auto"
    trace_offset_s: float = 0.0
    seed: int = 0
    hosts: int | None = None
    host: tuple[str, ...] = ()
    extra_hosts: tuple[str, ...] = field(default=())


def resolve_network(choice: NetworkChoice) -> tuple[NetworkProfile, list[str]]:
    """The profile and the campaign's default hosts (empty without a campaign)."""
    defaults: list[str] = []
    if choice.campaign is not None:
        from testbed.campaign.parse import load_campaign

        campaign = load_campaign(choice.campaign)
        if choice.delay_ms is not None or choice.rate_kbit is not None:
            raise UserError("--delay-ms/--rate-kbit: a campaign's network is defined in its "
                            "file; change it there")
        profile = campaign.network_profile(choice.name)
        cells = [c for c in campaign.cells() if c.network == choice.name]
        if cells:
            defaults = list(campaign.schedule(cells[0], campaign.templates[0]).agents)
            defaults += list(campaign.command.hosts) if campaign.command is not None else []
    else:
        profile = get_profile(choice.name, delay_ms=choice.delay_ms, rate_kbit=choice.rate_kbit)
    if profile.link is None and (choice.unshaped or any("=" in c for c in choice.cc)):
        raise UserError(f"--unshaped/--cc HOST=ALG: network {choice.name} has no links")
    if choice.unshaped:
        unshaped = tuple((check_host_name(h, "--unshaped"), LinkSpec(delay_ms=0.0))
                         for h in choice.unshaped)
        profile = replace(profile, hosts=(*profile.hosts, *unshaped))
    for item in choice.cc:
        host, _, alg = item.rpartition("=")
        alg = check_congestion_control(alg, "--cc")
        if host:
            check_host_name(host, "--cc")
            profile = replace(profile, host_congestion_control=(
                *profile.host_congestion_control, (host, alg)))
        else:
            profile = replace(profile, congestion_control=alg)
    return profile, defaults


def select_hosts(choice: NetworkChoice, segments: Sequence[Segment],
                 defaults: Sequence[str]) -> list[str]:
    """Rule 2."""
    if choice.hosts is not None and choice.host:
        raise UserError("--hosts/--host: give a count or names, not both")
    if choice.hosts is not None:
        names = [f"a{i}" for i in range(choice.hosts)]
    elif choice.host:
        names = [check_host_name(h, "--host") for h in choice.host]
    else:
        named = default_hosts(segments, count=0)
        bare = any(seg.host is None for seg in segments)
        base = list(defaults) or (["a0", "a1"] if bare or not named else [])
        if base:  # the hosts are given: a placeholder names one, it adds none (rule 2)
            known = base + [s.host for s in segments if s.host and s.host not in base]
            for seg in segments:
                missing = [h for h in referenced_hosts(seg.argv) if h not in known]
                if missing:
                    raise CommandError(f"{{addr:{missing[0]}}}: no host {missing[0]!r} in "
                                       f"this network; hosts: {', '.join(known)} (more "
                                       "with --hosts N or --host NAME)")
        names = base + [n for n in named if n not in base]
    for name in (*choice.unshaped, *(c.rpartition("=")[0] for c in choice.cc if "=" in c)):
        if name not in names:
            raise UserError(f"{name}: no such host; hosts: {', '.join(names)}")
    if len(set(names)) != len(names):
        raise UserError(f"--host: each host once; got {', '.join(names)}")
    limit, reason = host_limit(len(names))
    if len(names) > limit:
        flag = "--hosts" if choice.hosts is not None else "hosts"
        raise UserError(f"{flag}: {len(names)} is more than this machine can run; allowed: "
                        f"1..{limit} (set by {reason})")
    return names


TIMINGS_ENV = "TESTBED_EXEC_TIMINGS"
PHASES: dict[str, Any] = {}


def mark(phase: str) -> None:
    """Rule 5: note when PHASE was reached (only when asked for)."""
    if os.environ.get(TIMINGS_ENV):
        PHASES[phase] = time.time_ns()
        PHASES[f"{phase}_cpu"] = time.process_time()  # this process's CPU seconds so far


def write_timings() -> None:
    path = os.environ.get(TIMINGS_ENV)
    if path:
        Path(path).write_text(json.dumps(PHASES))


def _banner(net: HostNetwork, profile: NetworkProfile, where: str) -> str:
    hosts = " ".join(f"{n}={a}" for n, a in addresses_of(net.topo).items())
    return (f"testbed: {where} on {profile.name} ({net.topo.backend}, run prefix "
            f"{net.topo.prefix}); hosts {hosts}")


async def run_exec(choice: NetworkChoice, segments: Sequence[Segment], *,
                   timeout_s: float | None, stream: bool, output_dir: Path | None,
                   link_log: Path | None, quiet: bool = False) -> int:
    """``testbed exec`` (rules 1-4); returns the exit status."""
    profile, defaults = resolve_network(choice)
    hosts = select_hosts(choice, segments, defaults)
    specs = plan_commands(segments, hosts)
    mode = ("prefix" if stream else "files" if output_dir is not None or len(specs) > 1
            else "inherit")
    result = await _session(choice, profile, hosts, specs, what=f"{len(specs)} command(s)",
                            quiet=quiet, link_log=link_log, timeout_s=timeout_s, output=mode,
                            output_dir=output_dir, stdin=subprocess.DEVNULL,
                            print_captured=mode == "files" and output_dir is None)
    _report(result, timeout_s)
    return result.status


async def run_shell(choice: NetworkChoice, *, on: str | None, shell: str | None,
                    link_log: Path | None) -> int:
    """``testbed shell``: an interactive shell on one host (rules 1-3)."""
    profile, defaults = resolve_network(choice)
    hosts = select_hosts(choice, [Segment(on, ("sh",))] if on else [], defaults)
    host = on or hosts[0]
    if host not in hosts:
        raise CommandError(f"--on {host}: no such host; hosts: {', '.join(hosts)}")
    program = shell or os.environ.get("SHELL") or "/bin/sh"
    result = await _session(choice, profile, hosts, [CommandSpec(host, (program,))],
                            what=f"shell on {host}", quiet=False, link_log=link_log,
                            timeout_s=None, output="inherit", output_dir=None, stdin=None,
                            print_captured=False)
    return result.status


async def _session(choice: NetworkChoice, profile: NetworkProfile, hosts: list[str],
                   specs: list[CommandSpec], *, what: str, quiet: bool,
                   link_log: Path | None, timeout_s: float | None, output: str,
                   output_dir: Path | None, stdin: Any, print_captured: bool
                   ) -> SessionResult:
    """Build the network, run SPECS (with packet logs into LINK_LOG), remove it all."""
    if link_log is not None and profile.link is None:
        raise UserError(f"--link-log: network {profile.name} has no links to log")
    async with open_host_network(profile, hosts, backend=choice.backend,
                                 trace_offset_s=choice.trace_offset_s, seed=choice.seed,
                                 packet_log=link_log is not None) as net:
        mark("network_built")
        PHASES["prefix"] = net.topo.prefix
        if not quiet:
            tail = "; exit the shell to remove everything" if output == "inherit" and \
                stdin is None else ""
            print(_banner(net, profile, what) + tail, file=sys.stderr)

        async def on_trace_start(_: float) -> None:
            mark("commands_starting")
            if link_log is not None:
                await trio.to_thread.run_sync(partial(link_log.mkdir, parents=True,
                                                      exist_ok=True))
                await net.topo.start_link_log(str(link_log), f"testbed {what}")

        try:
            result = await run_commands(net.topo, specs, hosts_file=net.hosts_file,
                                        timeout_s=timeout_s, output=output,
                                        output_dir=output_dir or net.workdir / "output",
                                        stdin=stdin, on_trace_start=on_trace_start)
        finally:
            mark("commands_ended")
            if link_log is not None:
                with trio.CancelScope(shield=True):
                    await net.topo.stop_link_log()
        if print_captured:
            _print_captured(result)
    mark("removed")
    return result


def _print_captured(result: SessionResult) -> None:
    """Rule 4: captured output, program by program."""
    for p in result.programs:
        state = f"exit {p.status}" + (f", stopped: {p.stopped}" if p.stopped else "")
        sys.stdout.write(f"== {p.label} ({state}) ==\n")
        sys.stdout.flush()
        for path, sink in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            if path is not None and path.exists():
                sink.buffer.write(path.read_bytes())
                sink.flush()


def _report(result: SessionResult, timeout_s: float | None) -> None:
    if result.failure:
        print(f"testbed exec: {result.failure}", file=sys.stderr)
    if result.timed_out:
        running = [p.label for p in result.programs if p.stopped == "timeout"]
        print(f"testbed exec: timeout after {timeout_s:g} s; stopped: {', '.join(running)}",
              file=sys.stderr)


def choice_from_args(args: Any) -> NetworkChoice:
    return NetworkChoice(name=args.network, campaign=args.campaign, delay_ms=args.delay_ms,
                         rate_kbit=args.rate_kbit, unshaped=tuple(args.unshaped or ()),
                         cc=tuple(args.cc or ()), backend=args.backend,
                         trace_offset_s=args.trace_offset, seed=args.seed, hosts=args.hosts,
                         host=tuple(args.host or ()))
