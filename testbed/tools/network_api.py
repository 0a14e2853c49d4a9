"""A network for scripts and notebooks: build it, run programs in its hosts, remove it.

``testbed.api.network("att", hosts=["c", "s"], unshaped=["s"])`` is a context manager
in the spirit of Mininet's ``Mininet`` object, built by the path ``testbed exec`` takes
(``testbed.tools.user_network``: the network, its hosts, the host limit, the packet
logs and the removal). Rules:

1. The network lives in a trio run on a thread of its own, so the caller's code stays
   plain and blocking (a notebook cell, a script). The ``with`` block starts when every
   namespace and link is up; it raises what building raised (a ``UserError`` naming the
   argument, a ``HostError`` saying what the host lacks).
2. ``net[NAME].popen(argv, ...)`` starts a program in host NAME and returns its
   ``subprocess.Popen``; ``net[NAME].run(argv, ...)`` runs one to the end and returns a
   ``subprocess.CompletedProcess`` (text). Programs run under the launcher as ``testbed
   exec``'s do (``testbed.net.programs`` rule 1: the host's namespace, the run's hosts
   file, a PID namespace of their own), with exec's placeholders (``{addr:NAME}``...)
   and environment (``TESTBED_ADDR_<NAME>``...). A string is run by ``sh -c``.
3. Leaving the block, by its end or by an exception (Ctrl-C included; SIGTERM raises
   KeyboardInterrupt inside the block when it runs in the main thread), stops every
   program still running (SIGTERM through the launcher, SIGKILL after the grace), stops
   the packet logs and removes every namespace, link and file the network made, as
   ``testbed exec`` does; after a SIGKILL of the caller the launchers stop the programs
   and ``testbed clean`` removes the rest (they are in the run's ledger).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from testbed.errors import UserError
from testbed.links.linkspec import NetworkProfile
from testbed.net.commands import host_env, substitute
from testbed.net.programs import STOP_GRACE_S, STOP_MARGIN_S, launcher_argv
from testbed.net.session import HostNetwork, addresses_of
from testbed.tools.user_network import NetworkChoice, open_user_network, plan_network

BUILD_TIMEOUT_S = 300.0


class _Runner(threading.Thread):
    """The trio run that holds the network open until :meth:`close` (rule 1)."""

    def __init__(self, profile: NetworkProfile, hosts: list[str], choice: NetworkChoice,
                 link_log: Path | None) -> None:
        super().__init__(name="testbed-network", daemon=True)
        self.profile, self.hosts, self.choice, self.link_log = profile, hosts, choice, link_log
        self.ready = threading.Event()
        self.net: HostNetwork | None = None
        self.error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._close: trio.Event | None = None

    def run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # handed to the caller's thread (rule 1)
            self.error = exc
        finally:
            self.ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._close = trio.Event()
        async with open_user_network(self.choice, self.profile, self.hosts,
                                     link_log=self.link_log, label="testbed.api.network",
                                     link_log_field="link_log") as user:
            await user.start_link_log()  # from the moment the block starts
            self.net = user.net
            self.ready.set()
            await self._close.wait()

    def close(self) -> None:
        if self._token is not None and self._close is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._close.set, trio_token=self._token)
        self.join()


@dataclass
class NetHost:
    """One host of a live network (rule 2)."""

    name: str
    address: str
    netns: str | None
    network: Network = field(repr=False)

    def _argv(self, argv: str | Sequence[str]) -> list[str]:
        words = ["sh", "-c", argv] if isinstance(argv, str) else list(argv)
        if not words:
            raise UserError(f"{self.name}: give a command (an argv list or a string)")
        words = list(substitute(words, self.name, self.network.addresses))
        return launcher_argv(self.netns, tuple(words), hosts_file=self.network.hosts_file,
                             hostname=self.name, grace_s=STOP_GRACE_S)

    def popen(self, argv: str | Sequence[str], *, env: Mapping[str, str] | None = None,
              **options: Any) -> subprocess.Popen[Any]:
        """Start ARGV in this host; ``options`` go to ``subprocess.Popen`` (stdout=...)."""
        full_env = {**os.environ, **host_env(self.name, self.network.addresses),
                    **(env or {})}
        return self.network._start(self._argv(argv), env=full_env, **options)

    def run(self, argv: str | Sequence[str], *, timeout: float | None = None,
            check: bool = False, input: str | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ARGV in this host to its end; its output as text. On ``timeout`` the
        program is stopped and ``subprocess.TimeoutExpired`` raised."""
        process = self.popen(argv, env=env, stdin=subprocess.PIPE if input is not None
                             else subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(input, timeout=timeout)
        except BaseException:
            self.network._stop(process)
            raise
        finally:
            self.network._forget(process)
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check:
            done.check_returncode()
        return done


class Network:
    """A live network (module rules); get one from :func:`network`."""

    def __init__(self, runner: _Runner) -> None:
        assert runner.net is not None
        self._runner = runner
        self._net: HostNetwork = runner.net
        self.addresses: dict[str, str] = addresses_of(runner.net.topo)
        self.hosts_file: Path = runner.net.hosts_file
        self.link_log: Path | None = runner.link_log
        self._programs: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()
        self.hosts = {name: NetHost(name, host.address, host.netns, self)
                      for name, host in runner.net.topo.hosts.items()}

    def __getitem__(self, name: str) -> NetHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise UserError(f"{name}: no such host; hosts: {', '.join(self.hosts)}") from None

    @property
    def prefix(self) -> str:
        """The run prefix every namespace and link of this network is named with."""
        return self._net.topo.prefix

    @property
    def profile(self) -> NetworkProfile:
        return self._net.topo.plan.profile

    def _start(self, command: list[str], **options: Any) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = subprocess.Popen(command, **options)
        with self._lock:
            self._programs.append(process)
        ledger = self._net.topo.ledger
        if ledger is not None:
            ledger.record_process(process.pid)
        return process

    def _forget(self, process: subprocess.Popen[Any]) -> None:
        if process.poll() is None:
            return
        with self._lock:
            if process in self._programs:
                self._programs.remove(process)
        ledger = self._net.topo.ledger
        if ledger is not None:
            ledger.forget_process(process.pid)

    def _stop(self, process: subprocess.Popen[Any]) -> None:
        """SIGTERM to the launcher, SIGKILL after the grace (testbed.net.programs rule 2)."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S + STOP_MARGIN_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._forget(process)

    def _close(self) -> None:
        try:
            with self._lock:
                running = list(self._programs)
            for process in running:
                self._stop(process)
        finally:
            self._runner.close()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Rule 3: SIGTERM leaves the block as Ctrl-C does (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def network(name: str, *, hosts: Sequence[str] = ("a0", "a1"), unshaped: Sequence[str] = (),
            campaign: str | Path | None = None, delay_ms: float | None = None,
            rate_kbit: float | None = None, cc: Sequence[str] = (), backend: str = "auto",
            trace_offset_s: float = 0.0, seed: int = 0,
            link_log: str | Path | None = None) -> Iterator[Network]:
    """Build network NAME with HOSTS, yield it, remove it all on the way out (rules).

    The options are ``testbed exec``'s (``unshaped``: hosts with no link at all; ``cc``:
    ``ALG`` or ``HOST=ALG``; ``link_log``: a directory for every link's packet log).
    """
    if isinstance(hosts, str):
        raise UserError("hosts: a list of host names, e.g. hosts=['c', 's']")
    choice = NetworkChoice(name=name, campaign=None if campaign is None else str(campaign),
                           delay_ms=delay_ms, rate_kbit=rate_kbit, unshaped=tuple(unshaped),
                           cc=tuple(cc), backend=backend, trace_offset_s=trace_offset_s,
                           seed=seed, host=tuple(hosts))
    profile, names = plan_network(choice)
    log = None if link_log is None else Path(link_log).absolute()
    runner = _Runner(profile, names, choice, log)
    with _sigterm_as_interrupt():
        runner.start()
        try:
            runner.ready.wait(BUILD_TIMEOUT_S)
            if runner.error is not None:
                raise runner.error
            if runner.net is None:
                raise TimeoutError(f"network {name}: not built within {BUILD_TIMEOUT_S:g} s")
        except BaseException:
            runner.close()
            raise
        net = Network(runner)
        try:
            yield net
        finally:
            net._close()
