"""Run users' commands on a live topology: in order, with readiness, a deadline, output.

Rules:

1. Commands start in the order given (``testbed.net.commands`` rule 1); a command with
   a readiness check must pass it before the next one starts, and commands between two
   such points start at once (:func:`batches`). The traces restart (and
   ``on_trace_start`` runs) right before the first command that is not a service, so
   what the measured commands see starts at the trace offset, whatever the services
   took to start. Each command gets the environment of ``commands`` rule 3.
2. The session ends when every non-service command has exited, or at ``timeout_s``
   after the first command started, or when a command failed to become ready; then
   every program still running (services first of all) is stopped (``programs``
   rule 2). Programs are also stopped when the session is cancelled (SIGTERM, Ctrl-C),
   always before the topology goes.
3. Output per program: ``inherit`` (this process's stdout and stderr, e.g. one command
   or an interactive shell), ``files`` (``<output_dir>/<label>.out`` and ``.err``), or
   ``prefix`` (streamed here line by line, each line prefixed with ``[label]``).
4. A program's label is its host's name, or ``<host>.<k>`` when several commands run on
   one host (k from 1, in order).
5. The session's exit status (:attr:`SessionResult.status`) is 0 when every non-service
   command exited 0 and no service failed on its own; else the status of the first
   command (in the order given) that failed, 124 on timeout (as timeout(1)), and 125
   when a command failed to become ready.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import trio

from testbed.errors import UserError
from testbed.links.linkspec import NetworkProfile
from testbed.net.commands import CommandSpec, host_env, hosts_file_text, substitute
from testbed.net.programs import (
    STOP_GRACE_S,
    Program,
    ProgramFailed,
    start_program,
    stop_program,
    wait_ready,
)
from testbed.net.topology import Topology, open_topology

OUTPUT_MODES = ("inherit", "files", "prefix")
EXIT_TIMEOUT, EXIT_NOT_READY = 124, 125

EnvOf = Callable[[CommandSpec, str], Mapping[str, str]]


@dataclass(frozen=True)
class ProgramResult:
    """How one program ended."""

    label: str
    host: str
    argv: tuple[str, ...]
    service: bool
    status: int | None
    stopped: str  # "" (ended by itself), "service", "timeout", "cancelled", "failed"
    started: float
    ended: float | None
    stdout: Path | None = None
    stderr: Path | None = None


@dataclass
class SessionResult:
    """What a session did (rule 5)."""

    programs: list[ProgramResult] = field(default_factory=list)
    t0: float | None = None  # replay time 0 of the traces (time.monotonic())
    started: float = 0.0
    ended: float = 0.0
    timed_out: bool = False
    failure: str = ""  # why a command was not ready

    @property
    def status(self) -> int:
        if self.failure:
            return EXIT_NOT_READY
        if self.timed_out:
            return EXIT_TIMEOUT
        for p in self.programs:
            failed = p.status not in (0, None) and not p.stopped
            if failed and (not p.service or p.stopped == ""):
                return int(p.status or 1)
        return 0


def labels(specs: Sequence[CommandSpec]) -> list[str]:
    """Rule 4."""
    count = {s.host: sum(1 for t in specs if t.host == s.host) for s in specs}
    seen: dict[str, int] = {}
    out = []
    for s in specs:
        seen[s.host] = seen.get(s.host, 0) + 1
        out.append(s.host if count[s.host] == 1 else f"{s.host}.{seen[s.host]}")
    return out


def addresses_of(topo: Topology) -> dict[str, str]:
    return {name: host.address for name, host in topo.hosts.items()}


class _Output:
    """Where each program's stdout and stderr go (rule 3)."""

    def __init__(self, mode: str, directory: Path | None) -> None:
        if mode not in OUTPUT_MODES:
            raise UserError(f"output: {mode!r} is not allowed; allowed: {', '.join(OUTPUT_MODES)}")
        if mode == "files" and directory is None:
            raise ValueError("output files: give a directory")
        self.mode, self.directory = mode, directory
        self.files: dict[str, tuple[Path, Path]] = {}

    def open(self, label: str) -> tuple[Any, Any]:
        if self.mode == "inherit":
            return None, None
        if self.mode == "prefix":
            return subprocess.PIPE, subprocess.PIPE
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        out, err = self.directory / f"{label}.out", self.directory / f"{label}.err"
        self.files[label] = (out, err)
        return open(out, "wb"), open(err, "wb")  # closed by run_commands once started


async def _pump(stream: Any, label: str, sink: BinaryIO) -> None:
    """Copy a program's pipe here, line by line, each line prefixed (rule 3)."""
    prefix = f"[{label}] ".encode()
    pending = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            sink.write(prefix + line + b"\n")
        sink.flush()
    if pending:
        sink.write(prefix + pending + b"\n")
        sink.flush()


def batches(specs: Sequence[CommandSpec]) -> list[tuple[int, int]]:
    """Runs of commands that may start together (rule 1): a batch ends after a command
    with a readiness check, and before the first command that is not a service (the
    trace restarts right before it)."""
    first = next((i for i, s in enumerate(specs) if not s.service), len(specs))
    out: list[tuple[int, int]] = []
    start = 0
    for i, spec in enumerate(specs):
        if i == first and i > start:
            out.append((start, i))
            start = i
        if spec.ready is not None:
            out.append((start, i + 1))
            start = i + 1
    if start < len(specs):
        out.append((start, len(specs)))
    return out


async def run_commands(topo: Topology, specs: Sequence[CommandSpec], *,
                       hosts_file: Path | None, timeout_s: float | None = None,
                       output: str = "inherit", output_dir: Path | None = None,
                       stdin: Any = subprocess.DEVNULL, env_of: EnvOf | None = None,
                       on_trace_start: Callable[[float], Awaitable[None]] | None = None,
                       grace_s: float = STOP_GRACE_S, cwd: str | None = None
                       ) -> SessionResult:
    """Run SPECS on TOPO's hosts (the module rules) in directory CWD (default: this
    process's); returns how each ended. Commands of one batch (:func:`batches`) start
    at once."""
    addresses = addresses_of(topo)
    sink = _Output(output, output_dir)
    result = SessionResult(started=time.monotonic())
    started: dict[int, Program] = {}
    names = labels(specs)
    deadline = trio.current_time() + timeout_s if timeout_s is not None else float("inf")
    why = "cancelled"

    async def start(index: int, nursery: trio.Nursery) -> None:
        spec, label = specs[index], names[index]
        env = host_env(spec.host, addresses,
                       t0_ns=None if result.t0 is None else int(result.t0 * 1e9))
        if env_of is not None:
            env.update(env_of(spec, label))
        argv = substitute(spec.argv, spec.host, addresses)
        out, err = sink.open(label)
        try:
            program = await start_program(topo, spec, label=label, argv=argv, env=env,
                                          hosts_file=hosts_file, stdin=stdin, stdout=out,
                                          stderr=err, grace_s=grace_s, cwd=cwd,
                                          nursery=nursery)
        finally:
            for f in (out, err):
                if hasattr(f, "close"):
                    f.close()
        started[index] = program
        if output == "prefix":
            nursery.start_soon(_pump, program.process.stdout, label, sys.stdout.buffer)
            nursery.start_soon(_pump, program.process.stderr, label, sys.stderr.buffer)

    async with trio.open_nursery() as nursery:
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                for first, last in batches(specs):
                    if result.t0 is None and not all(s.service for s in specs[first:last]):
                        result.t0 = await topo.restart_trace()
                        if on_trace_start is not None:
                            await on_trace_start(result.t0)
                    async with trio.open_nursery() as starting:
                        for index in range(first, last):
                            starting.start_soon(start, index, nursery)
                    ready = specs[last - 1].ready
                    if ready is not None:
                        await wait_ready(started[last - 1], ready)
                for program in started.values():
                    if not program.spec.service:
                        await program.done.wait()
            result.timed_out = scope.cancelled_caught
            why = "timeout" if result.timed_out else "service"
        except ProgramFailed as exc:
            result.failure, why = str(exc), "failed"
        finally:
            with trio.CancelScope(shield=True):
                await _stop_all(list(started.values()), why, grace_s)
    result.ended = time.monotonic()
    for index in sorted(started):
        program, label = started[index], names[index]
        out_err = sink.files.get(label, (None, None))
        result.programs.append(ProgramResult(
            label, program.spec.host, program.argv, program.spec.service, program.status,
            program.stopped, program.started, program.ended, *out_err))
    return result


async def _stop_all(programs: Sequence[Program], why: str, grace_s: float) -> None:
    """Stop every program still running, all at once (services and stragglers)."""
    async with trio.open_nursery() as nursery:
        for program in programs:
            if program.running:
                nursery.start_soon(partial(stop_program, program, why=why, grace_s=grace_s))


@dataclass(frozen=True)
class HostNetwork:
    """A topology ready for users' programs: its hosts file and a directory of the run."""

    topo: Topology
    hosts_file: Path
    workdir: Path


@asynccontextmanager
async def open_host_network(profile: NetworkProfile, hosts: Sequence[str], *,
                            backend: str = "auto", trace_offset_s: float = 0.0,
                            seed: int = 0, packet_log: bool = False,
                            prefix: str | None = None) -> AsyncIterator[HostNetwork]:
    """Build the topology of HOSTS on PROFILE (``testbed.net.topology``) with a directory
    for the run (hosts file, captured output; recorded in the topology's ledger) and
    remove all of it on exit."""
    async with open_topology(profile, hosts, backend=backend, trace_offset_s=trace_offset_s,
                             seed=seed, packet_log=packet_log, prefix=prefix) as topo:
        ledger = topo.ledger
        workdir = (await trio.to_thread.run_sync(ledger.new_tmpdir, "pft-run")
                   if ledger is not None else Path(tempfile.mkdtemp(prefix="pft-run-")))
        try:
            hosts_file = workdir / "hosts"
            hosts_file.write_text(hosts_file_text(addresses_of(topo)))
            os.chmod(workdir, 0o755)
            os.chmod(hosts_file, 0o644)
            yield HostNetwork(topo, hosts_file, workdir)
        finally:
            if ledger is not None:
                ledger.remove_tmpdir(workdir)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
