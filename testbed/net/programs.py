"""Users' programs inside a live topology's hosts: start, watch, wait until ready, stop.

Rules:

1. A program runs under the launcher (``testbed.host.launcher``): inside the host's
   network namespace, with the run's hosts file as /etc/hosts and in a PID namespace of
   its own, so everything it starts goes when it goes. The launcher's pid (and start
   time) is recorded in the topology's ledger as soon as it exists and forgotten once it
   has exited; ``testbed clean`` stops it by that pid after a crash, and the launcher
   itself stops the program when the controller is gone.
2. Stopping is SIGTERM to the launcher, which passes it to every process of the host's
   PID namespace and exits after ``grace_s``; a launcher that has not exited
   ``grace_s + STOP_MARGIN_S`` later is killed (its PID namespace dies with it).
3. Readiness is read, never probed on the wire: a TCP port is ready when a socket of
   the host's namespace listens on it (``/proc/<launcher pid>/net/tcp``, ``tcp6``), a
   UDP port when one is bound to it; a program that exits first has failed. Nothing
   connects to the program, so its traffic and logs stay its own.
4. Exit status: the program's (128 + N when signal N ended it), as the launcher reports
   it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from testbed.errors import RunFailure
from testbed.host import launcher
from testbed.net.commands import CommandSpec, Readiness
from testbed.net.topology import Topology

LAUNCHER_PATH = Path(launcher.__file__).resolve()
STOP_GRACE_S = 2.0
STOP_MARGIN_S = 2.0
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.01
_LISTEN, _UDP_BOUND = "0A", "07"


class ProgramFailed(RunFailure):
    """A user's program could not start or become ready (one line naming it)."""


@dataclass
class Program:
    """One started program (rule 1)."""

    spec: CommandSpec
    label: str
    argv: tuple[str, ...]
    process: trio.Process
    netns: str | None
    started: float
    ledger: Any = None
    ended: float | None = None
    status: int | None = None
    stopped: str = ""  # why the testbed stopped it: "", "service", "timeout", "cancelled"
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return not self.done.is_set()


def launcher_argv(netns: str | None, argv: tuple[str, ...], *, hosts_file: Path | None,
                  hostname: str, grace_s: float) -> list[str]:
    """The launcher's command line for one program."""
    out = [sys.executable, "-I", "-S", str(LAUNCHER_PATH), "--hostname", hostname,
           "--watch-pid", str(os.getpid()), "--grace-s", f"{grace_s:g}"]
    if netns is not None:
        out += ["--netns", netns]
    if hosts_file is not None:
        out += ["--hosts-file", str(hosts_file)]
    return [*out, "--", *argv]


async def start_program(topo: Topology, spec: CommandSpec, *, label: str,
                        argv: tuple[str, ...], env: Mapping[str, str],
                        hosts_file: Path | None, stdin: Any = None, stdout: Any = None,
                        stderr: Any = None, grace_s: float = STOP_GRACE_S,
                        cwd: str | None = None, nursery: trio.Nursery) -> Program:
    """Start ARGV on SPEC's host (rule 1); a task of NURSERY watches it until it exits."""
    netns = topo.hosts[spec.host].netns
    command = launcher_argv(netns, argv, hosts_file=hosts_file, hostname=spec.host,
                            grace_s=grace_s)
    process = await trio.lowlevel.open_process(
        command, stdin=stdin, stdout=stdout, stderr=stderr, env={**os.environ, **env},
        cwd=cwd)
    program = Program(spec, label, argv, process, netns, time.monotonic(), topo.ledger)
    if topo.ledger is not None:
        await trio.to_thread.run_sync(topo.ledger.record_process, process.pid)
    nursery.start_soon(_watch, program)
    return program


async def _watch(program: Program) -> None:
    """Record how PROGRAM ended. Shielded: whoever cancels a session stops its programs
    first (``testbed.net.session``), and the record must not be lost."""
    try:
        with trio.CancelScope(shield=True):
            await program.process.wait()
    finally:
        code = program.process.returncode
        if code is not None:
            program.status = 128 - code if code < 0 else code
            program.ended = time.monotonic()
            if program.ledger is not None:
                program.ledger.forget_process(program.pid)
            program.done.set()


async def stop_program(program: Program, *, why: str, grace_s: float = STOP_GRACE_S) -> None:
    """Stop PROGRAM if it still runs (rule 2); safe to call when it has exited."""
    if not program.running:
        return
    program.stopped = why
    with contextlib.suppress(ProcessLookupError):
        program.process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace_s + STOP_MARGIN_S):
        await program.done.wait()
    if program.running:
        with contextlib.suppress(ProcessLookupError):
            program.process.kill()
        await program.done.wait()


def _netns_inode(netns: str | None) -> int | None:
    if netns is None:
        return None
    try:
        return os.stat(f"/var/run/netns/{netns}").st_ino
    except OSError:
        return None


def listening(pid: int, netns: str | None, kind: str, port: int) -> bool:
    """Whether a socket of PID's network namespace listens on (TCP) or is bound to (UDP)
    PORT; False while PID is not yet inside NETNS (rule 3)."""
    want = _netns_inode(netns)
    try:
        if want is not None and os.stat(f"/proc/{pid}/ns/net").st_ino != want:
            return False
        lines: list[str] = []
        for table in (kind, f"{kind}6"):
            with contextlib.suppress(FileNotFoundError):
                lines += Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
    except OSError:
        return False
    state = _LISTEN if kind == "tcp" else _UDP_BOUND
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
            return True
    return False


async def wait_ready(program: Program, ready: Readiness, *,
                     timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once PROGRAM is ready (rule 3), or has ended well (a command, not a service,
    that exited 0); ProgramFailed if it ended otherwise first or is not ready within
    TIMEOUT_S."""
    what = ready.describe()
    if ready.kind == "delay":
        with trio.move_on_after(ready.delay_s):
            await program.done.wait()
    else:
        with trio.move_on_after(timeout_s):
            while program.running:
                if listening(program.pid, program.netns, ready.kind, ready.port):
                    return
                await trio.sleep(READY_POLL_S)
        if program.running:
            raise ProgramFailed(f"{program.label}: not ready ({what}) after {timeout_s:g} s")
    if not program.running and (program.spec.service or program.status != 0):
        raise ProgramFailed(f"{program.label}: exited with status {program.status} before "
                            f"it was ready ({what})")
