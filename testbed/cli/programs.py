"""``testbed exec`` and ``testbed shell``: your own programs on an emulated network.

Their arguments end in commands (``-- COMMAND`` or ``--on HOST ... -- COMMAND``
segments) that argparse cannot split, so each sub-command takes its arguments raw and
parses the options before the first ``--`` / ``--on`` itself
(``testbed.net.commands.split_segments``).
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from testbed.cli.common import directory, positive_int, require_root

EXEC_USAGE = ("testbed exec NETWORK [options] -- COMMAND ...\n"
              "       testbed exec NETWORK [options] --on HOST [--service] [--ready SPEC] "
              "-- COMMAND ... [--on HOST ... -- COMMAND ...]")
EXEC_EPILOG = """\
commands: `-- COMMAND` runs COMMAND on every selected host at once; `--on HOST -- COMMAND`
runs it on HOST (repeat for more: commands start in the order given). Per --on:
  --service     started first, stopped once the other commands have ended
  --ready SPEC  wait before starting the next command: tcp:PORT, udp:PORT (a socket
                listens / is bound in the host) or delay:SECONDS
Placeholders: {host}, {addr} (this host), {addr:NAME} (host NAME), {hosts}. Environment:
TESTBED_HOST, TESTBED_ADDR, TESTBED_HOSTS, TESTBED_ADDR_<NAME>, TESTBED_T0_NS. Host names
resolve inside the hosts (/etc/hosts of the run). Exit status: the commands' (the first
that failed), 124 on --timeout, 125 when a command did not become ready, 130 on Ctrl-C
and 143 on SIGTERM (once everything is removed).

examples:
  testbed exec att --on c -- ping -c 20 {addr:s}
  testbed exec att --unshaped s --on s --service --ready tcp:8000 -- python3 -m http.server \\
      --on c -- curl -s -o /dev/null -w '%{time_total}\\n' http://s:8000/
  testbed exec fixed --rate-kbit 12000 --hosts 3 --stream -- sh -c 'hostname; ping -c 3 a0'
"""


def _network_options(p: argparse.ArgumentParser) -> None:
    from testbed.links.backend import BACKEND_CHOICES as BACKENDS  # light: no registries

    p.add_argument("network", help="a network (`testbed networks list`) or, with "
                                   "--campaign, one the campaign file defines")
    p.add_argument("--campaign", metavar="FILE", help="a campaign file whose [networks] "
                   "define NETWORK (per-host links included)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("--hosts", type=positive_int, metavar="N", help="N hosts a0..")
    hosts.add_argument("--host", action="append", metavar="NAME",
                       help="a host by name (repeatable)")
    p.add_argument("--unshaped", action="append", metavar="HOST",
                   help="HOST gets no link at all: no delay, rate or loss (repeatable)")
    p.add_argument("--cc", action="append", metavar="[HOST=]ALG",
                   help="TCP congestion control of the network, or of one host (repeatable)")
    p.add_argument("--delay-ms", type=float, metavar="MS", help="one-way delay per link "
                   "crossing (built-in networks)")
    p.add_argument("--rate-kbit", type=float, metavar="KBIT",
                   help="fixed rate of every link (networks without traces, e.g. fixed)")
    p.add_argument("--backend", choices=list(BACKENDS), default="auto",
                   help="link backend (default auto)")
    p.add_argument("--trace-offset", type=float, default=0.0, metavar="S",
                   help="seconds into the traces where replay starts (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the links' loss (default 0)")
    p.add_argument("--link-log", metavar="DIR",
                   help="write every link's packet log (Mahimahi format) into DIR")


def _exec_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testbed exec", usage=EXEC_USAGE, epilog=EXEC_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Run commands inside the hosts of an emulated "
                                            "network; everything is removed afterwards.")
    _network_options(p)
    p.add_argument("--timeout", type=float, metavar="S",
                   help="stop every command after S seconds (exit 124)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--stream", action="store_true",
                     help="stream every command's output live, lines prefixed with [host]")
    out.add_argument("--output", metavar="DIR",
                     help="write each command's output to DIR/<host>.out and .err")
    p.add_argument("--quiet", action="store_true", help="no banner on stderr")
    return p


def _shell_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed shell",
        description="An interactive shell inside one host of an emulated network (the "
                    "traces restart when it starts); everything is removed when it exits.")
    _network_options(p)
    p.add_argument("--on", metavar="HOST", help="the host the shell runs on (default: the "
                                                 "first host)")
    p.add_argument("--shell", metavar="PROGRAM", help="the shell (default $SHELL, else /bin/sh)")
    return p


def _link_log(text: str | None) -> Path | None:
    path = directory("--link-log", text)
    return None if path is None else path.absolute()


def _quick_exit() -> None:
    """Everything is removed by now: spare the interpreter's final collection over the
    heap the network modules built (0.3-0.6 s of the exit on this host, docs/benchmarks.md)."""
    gc.freeze()


def cmd_exec(args: argparse.Namespace) -> int:
    import trio

    from testbed.net.commands import split_segments
    from testbed.tools.user_exec import choice_from_args, mark, run_exec, write_timings

    mark("main")

    options, segments = split_segments(args.raw)
    parsed = _exec_parser().parse_args(options)
    if not segments:
        _exec_parser().error("give a command: -- COMMAND, or --on HOST -- COMMAND")
    require_root("exec")
    if parsed.timeout is not None and not parsed.timeout > 0:
        _exec_parser().error("--timeout: a number of seconds > 0")

    async def main() -> int:
        from testbed.interrupts import guard

        with guard():  # a second Ctrl-C while it cleans up: one line (testbed.interrupts)
            return await run_exec(
                choice_from_args(parsed), segments, timeout_s=parsed.timeout,
                stream=parsed.stream, output_dir=directory("--output", parsed.output),
                link_log=_link_log(parsed.link_log), quiet=parsed.quiet)

    try:
        return trio.run(main)
    finally:
        _quick_exit()
        write_timings()


def cmd_shell(args: argparse.Namespace) -> int:
    import trio

    from testbed.tools.user_exec import choice_from_args, run_shell

    parsed = _shell_parser().parse_args(args.raw)
    require_root("shell")
    try:
        return trio.run(lambda: run_shell(choice_from_args(parsed), on=parsed.on,
                                          shell=parsed.shell,
                                          link_log=_link_log(parsed.link_log)))
    finally:
        _quick_exit()


def register(sub: Any) -> None:
    for name, func, text in (
            ("exec", cmd_exec, "run commands in the hosts of an emulated network "
                               "(`testbed exec NETWORK --help`)"),
            ("shell", cmd_shell, "an interactive shell in one host of an emulated network")):
        p = sub.add_parser(name, help=text, prefix_chars="+", add_help=False)
        p.add_argument("raw", nargs=argparse.REMAINDER)
        p.set_defaults(func=func)

