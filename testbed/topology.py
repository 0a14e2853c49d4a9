"""The campaign's network: one namespace per agent (+ central), each behind an emulated link.

Describe, then build: `plan_topology` is pure (names, addresses, backend choice, no
kernel); `open_topology` builds that plan and tears it down. Rules:

- host i gets namespace ``<prefix>-<name>``, TUN device ``<prefix>t<i>`` and address
  198.18.0.0 + i + 1 (198.18.0.0/15, the benchmarking range); its only route is
  198.18.0.0/15 through the TUN device, so no traffic can leave for anywhere else;
- `loopback` builds nothing: every host is 127.0.0.1 in the root namespace;
- a shaped profile never runs unshaped: a backend that cannot run raises TopologyError;
- every namespace gets the profile's TCP congestion control and forgets TCP metrics
  between connections (tcp_no_metrics_save=1) so fresh connections start alike;
- everything is written to a `netns.Ledger` before it is created and removed in reverse
  order on exit, after an exception in the body, on SIGINT/SIGTERM, or by `testbed clean`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from testbed import netns
from testbed.links.emulator_main import EmulatedHost, EmulatorHandle, open_emulator
from testbed.links.profiles import NetworkProfile
from testbed.links.userspace import direction_spec

BACKENDS = ("auto", "userspace", "netem", "none")
CENTRAL = "central"
_BASE = ipaddress.IPv4Address("198.18.0.0")
_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")


class TopologyError(RuntimeError):
    """The topology cannot be built here (bad input or missing kernel feature); one line."""


@dataclass(frozen=True)
class Host:
    name: str
    netns: str | None
    address: str


@dataclass(frozen=True)
class TopologyPlan:
    """What `open_topology` will build; pure data."""

    profile: NetworkProfile
    prefix: str
    backend: str
    hosts: tuple[Host, ...]
    tun_names: tuple[str, ...]
    trace_offset_s: float


def _netem_available() -> bool:
    try:
        from testbed.links import netem
    except ImportError:
        return False
    probe = getattr(netem, "netem_available", None)
    if probe is None:
        return False
    return bool(probe()[0])


def resolve_backend(profile: NetworkProfile, backend: str) -> str:
    if backend not in BACKENDS:
        raise TopologyError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if profile.link is None:
        if backend not in ("auto", "none"):
            raise TopologyError(
                f"backend: profile {profile.name!r} has no link to shape; use auto or none"
            )
        return "none"
    if backend == "none":
        raise TopologyError(
            f"backend: none would run profile {profile.name!r} unshaped; "
            "use auto, userspace or netem"
        )
    if backend == "auto":
        return "netem" if _netem_available() else "userspace"
    return backend


def plan_topology(
    profile: NetworkProfile,
    agents: Sequence[str],
    *,
    central: bool = False,
    prefix: str | None = None,
    trace_offset_s: float = 0.0,
    backend: str = "auto",
) -> TopologyPlan:
    """Validate the input and name everything; touches nothing."""
    names = list(agents)
    if not names:
        raise TopologyError("agents: give at least one agent name")
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TopologyError(f"agents: {name!r} must be 1-32 letters, digits or _")
    if central:
        if CENTRAL in names:
            raise TopologyError(f"agents: {CENTRAL!r} is reserved for the central host")
        names.append(CENTRAL)
    if len(set(names)) != len(names):
        raise TopologyError("agents: names must be unique")
    if not (isinstance(trace_offset_s, int | float) and 0 <= trace_offset_s < 1e6):
        raise TopologyError(f"trace_offset_s: a number >= 0, got {trace_offset_s!r}")
    chosen = resolve_backend(profile, backend)
    run_prefix = netns.check_prefix(prefix) if prefix is not None else netns.new_prefix()
    if chosen == "none":
        hosts = tuple(Host(n, None, "127.0.0.1") for n in names)
        tuns: tuple[str, ...] = ()
    else:
        hosts = tuple(
            Host(n, f"{run_prefix}-{n}", str(_BASE + i + 1)) for i, n in enumerate(names)
        )
        tuns = tuple(f"{run_prefix}t{i}" for i in range(len(names)))
    return TopologyPlan(profile, run_prefix, chosen, hosts, tuns, float(trace_offset_s))


@dataclass
class Topology:
    plan: TopologyPlan
    hosts: dict[str, Host]
    _emulator: EmulatorHandle | None = None
    _netem: Any = None

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    async def restart_trace(self) -> None:
        """Restart every link's trace clock at the offset (call at each episode start)."""
        if self._emulator is not None:
            await self._emulator.restart_trace()
        elif self._netem is not None:
            await self._netem.restart_trace()

    async def link_counters(self) -> dict[str, dict[str, int]]:
        """Per host: packets/bytes that left each direction, and drops (queue full + loss)."""
        if self._emulator is not None:
            return await self._emulator.counters()
        if self._netem is not None:
            counters: dict[str, dict[str, int]] = await trio.to_thread.run_sync(
                self._netem.counters
            )
            return counters
        zero = dict.fromkeys(
            ("up_packets", "up_bytes", "up_drops", "down_packets", "down_bytes", "down_drops"),
            0,
        )
        return {name: dict(zero) for name in self.hosts}

    def describe(self) -> dict[str, Any]:
        """Provenance for the manifest."""
        profile = self.plan.profile
        link = profile.link
        return {
            "profile": profile.name,
            "backend": self.backend,
            "congestion_control": profile.congestion_control if link is not None else None,
            "up_trace": None if link is None else link.up_trace,
            "down_trace": None if link is None else link.down_trace,
            "trace_offset_s": self.plan.trace_offset_s,
            "delay_ms": None if link is None else link.delay_ms,
            "rate_kbit": None if link is None else link.rate_kbit,
            "loss_pct": None if link is None else link.loss_pct,
            "queue_packets": None if link is None else link.queue_packets,
            "queue_bytes": None if link is None else link.queue_bytes,
            "prefix": self.prefix,
            "hosts": {h.name: {"netns": h.netns, "address": h.address} for h in self.hosts.values()},
        }


def _check_root(backend: str) -> None:
    if os.geteuid() != 0:
        raise TopologyError(f"backend {backend}: needs root (network namespaces)")
    if backend == "userspace" and not os.path.exists("/dev/net/tun"):
        raise TopologyError("backend userspace: /dev/net/tun is missing on this host")


def _setup_namespace(ledger: netns.Ledger, host: Host, cc: str) -> None:
    assert host.netns is not None
    ledger.record_netns(host.netns)
    netns.create_netns(host.netns)
    netns.set_sysctl(host.netns, "net.ipv4.tcp_congestion_control", cc)
    netns.set_sysctl(host.netns, "net.ipv4.tcp_no_metrics_save", "1")


def _setup_tun(ledger: netns.Ledger, host: Host, ifname: str) -> int:
    assert host.netns is not None
    ledger.record_link(ifname, host.netns)
    fd = netns.open_tun(ifname)
    try:
        netns.move_link(ifname, host.netns)
        netns.configure_host_link(host.netns, ifname, host.address)
    except BaseException:
        os.close(fd)
        raise
    return fd


@asynccontextmanager
async def open_topology(
    profile: NetworkProfile,
    agents: Sequence[str],
    *,
    central: bool = False,
    prefix: str | None = None,
    trace_offset_s: float = 0.0,
    backend: str = "auto",
    seed: int = 0,
) -> AsyncIterator[Topology]:
    """Build the topology, yield it, and remove everything it created on the way out."""
    plan = plan_topology(
        profile, agents, central=central, prefix=prefix,
        trace_offset_s=trace_offset_s, backend=backend,
    )
    hosts = {h.name: h for h in plan.hosts}
    if plan.backend == "none":
        yield Topology(plan, hosts)
        return
    _check_root(plan.backend)
    link = profile.link
    assert link is not None
    offset_ms = plan.trace_offset_s * 1000.0
    try:
        up = direction_spec(link, "up", offset_ms=offset_ms)
        down = direction_spec(link, "down", offset_ms=offset_ms)
    except ValueError as exc:
        raise TopologyError(f"network: {exc}") from exc
    ledger = netns.Ledger(plan.prefix)
    tun_fds: list[int] = []
    scope = trio.CancelScope()
    with _cancel_on_sigterm(scope):
        try:
            with scope:
                try:
                    await trio.to_thread.run_sync(
                        netns.allow_congestion_control, ledger, profile.congestion_control
                    )
                except ValueError as exc:
                    raise TopologyError(str(exc)) from exc
                for host in plan.hosts:
                    await trio.to_thread.run_sync(
                        _setup_namespace, ledger, host, profile.congestion_control
                    )
                if plan.backend == "netem":
                    from testbed.links.netem import NetemHost, open_netem_links

                    netem_hosts = [
                        NetemHost(h.name, str(h.netns), h.address) for h in plan.hosts
                    ]
                    async with open_netem_links(
                        profile, netem_hosts, prefix=plan.prefix, ledger=ledger,
                        trace_offset_ms=offset_ms,
                    ) as netem_backend:
                        yield Topology(plan, hosts, _netem=netem_backend)
                else:
                    for host, ifname in zip(plan.hosts, plan.tun_names, strict=True):
                        tun_fds.append(
                            await trio.to_thread.run_sync(_setup_tun, ledger, host, ifname)
                        )
                    emulated = [
                        EmulatedHost(h.name, h.address, fd, up, down)
                        for h, fd in zip(plan.hosts, tun_fds, strict=True)
                    ]
                    async with open_emulator(
                        emulated, seed=seed, on_start=ledger.record_process
                    ) as emulator:
                        yield Topology(plan, hosts, emulator)
        finally:
            with trio.CancelScope(shield=True):
                for fd in tun_fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                await trio.to_thread.run_sync(partial(ledger.teardown))
    if scope.cancelled_caught:
        raise KeyboardInterrupt("SIGTERM: topology removed")


class _SigtermScopes:
    """The cancel scopes of every live topology of this process (several with
    ``testbed run --jobs N``). One SIGTERM handler serves them all: it is installed when
    the first topology opens and the previous handler is restored when the last closes,
    so topologies that open and close out of order never leave a stale handler behind."""

    def __init__(self) -> None:
        self.scopes: dict[int, tuple[trio.lowlevel.TrioToken, trio.CancelScope]] = {}
        self.previous: Any = None

    def on_sigterm(self, signum: int, frame: Any) -> None:
        for token, scope in list(self.scopes.values()):
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

    def add(self, scope: trio.CancelScope) -> None:
        if not self.scopes:
            self.previous = signal.signal(signal.SIGTERM, self.on_sigterm)
        self.scopes[id(scope)] = (trio.lowlevel.current_trio_token(), scope)

    def remove(self, scope: trio.CancelScope) -> None:
        self.scopes.pop(id(scope), None)
        if not self.scopes:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


_SIGTERM_SCOPES = _SigtermScopes()


@contextlib.contextmanager
def _cancel_on_sigterm(scope: trio.CancelScope) -> Iterator[None]:
    """On SIGTERM cancel SCOPE (then `open_topology` cleans up and raises KeyboardInterrupt).

    SIGINT already reaches trio as KeyboardInterrupt; SIGTERM must too, because a process
    started in the background by a non-interactive shell ignores SIGINT. Cancelling through
    the trio token is safe at any point, unlike raising from the signal handler.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SIGTERM_SCOPES.add(scope)
    try:
        yield
    finally:
        _SIGTERM_SCOPES.remove(scope)


class Network:
    """A Mininet-style handle on :func:`open_topology` for scripts and notebooks.

    ``net = Network(profile, agents); topo = await net.start(); ...; await net.stop()``,
    or ``async with Network(profile, agents) as topo:``. ``start`` and ``stop`` must run
    in the same trio task; ``stop`` removes everything ``start`` created and is safe to
    call twice. Prefer ``open_topology`` inside structured code.
    """

    def __init__(self, profile: NetworkProfile, agents: Sequence[str], **options: Any) -> None:
        self.profile = profile
        self.agents = list(agents)
        self.options = options
        self.topology: Topology | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    async def start(self) -> Topology:
        if self._stack is not None:
            raise TopologyError("network: already started")
        stack = contextlib.AsyncExitStack()
        self.topology = await stack.enter_async_context(
            open_topology(self.profile, self.agents, **self.options))
        self._stack = stack
        return self.topology

    async def stop(self) -> None:
        stack, self._stack, self.topology = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> Topology:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
