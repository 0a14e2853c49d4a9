"""``testbed exec`` and ``testbed shell``: your own programs on an emulated network.

Rules:

1. The network, its hosts and its removal are ``testbed.tools.user_network``'s (the
   path ``testbed.api.network`` takes too): ``--unshaped HOST``, ``--cc [HOST=]ALG``,
   ``--hosts N`` / ``--host NAME`` / the hosts the commands name, the host limit of
   ``testbed.net.capacity``; everything is built before the first command starts and
   removed after the last one ended, on Ctrl-C and on SIGTERM; after a SIGKILL of the
   controller the launchers stop the programs and ``testbed clean`` removes the rest.
2. ``--link-log DIR``: every link's packet log, from the traces' start (when the first
   command starts) to the end of the last command.
3. The shell runs on ``--on HOST`` or the first host.
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
from pathlib import Path
from typing import Any

from testbed.links.linkspec import NetworkProfile
from testbed.net.commands import (
    CommandError,
    CommandSpec,
    Segment,
    plan_commands,
)
from testbed.net.session import (
    HostNetwork,
    SessionResult,
    addresses_of,
    run_commands,
)
from testbed.tools.user_network import NetworkChoice, open_user_network, plan_network

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
    profile, hosts = plan_network(choice, segments)
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
    profile, hosts = plan_network(choice, [Segment(on, ("sh",))] if on else [])
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
    async with open_user_network(choice, profile, hosts, link_log=link_log,
                                 label=f"testbed {what}") as user:
        net = user.net
        mark("network_built")
        PHASES["prefix"] = net.topo.prefix
        if not quiet:
            tail = "; exit the shell to remove everything" if output == "inherit" and \
                stdin is None else ""
            print(_banner(net, profile, what) + tail, file=sys.stderr)

        async def on_trace_start(_: float) -> None:
            mark("commands_starting")
            await user.start_link_log()

        try:
            result = await run_commands(net.topo, specs, hosts_file=net.hosts_file,
                                        timeout_s=timeout_s, output=output,
                                        output_dir=output_dir or net.workdir / "output",
                                        stdin=stdin, on_trace_start=on_trace_start)
        finally:
            mark("commands_ended")
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
