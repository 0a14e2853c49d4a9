"""Build a planned topology: one namespace per host, behind a link backend; tear it down.

Describe, then build: ``testbed.net.plan`` names everything; ``open_topology`` resolves
the backend (probing the host once), builds the plan and removes everything on exit.
Rules:

- every namespace gets the profile's TCP congestion control and forgets TCP metrics
  between connections (tcp_no_metrics_save=1) so fresh connections start alike;
- the link backend (``testbed.links``) shapes each host's access link: host A's uplink
  then host B's downlink carry A->B traffic;
- a shaped profile never runs unshaped: a backend that cannot run raises HostError;
- everything is written to a ``Ledger`` before it is created and removed in reverse
  order on exit, after an exception in the body, on SIGINT/SIGTERM, or by
  ``testbed clean``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from testbed.errors import HostError
from testbed.host import kernel
from testbed.host.ledger import Ledger, allow_congestion_control
from testbed.host.userns import privilege
from testbed.links.backend import NO_BACKEND, LinkBackend, LinkHost
from testbed.links.backends import open_links, resolve_backend
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.net.plan import Host, TopologyError, TopologyPlan, plan_topology
from testbed.net.signals import cancel_on_sigterm

_ZERO_COUNTERS = ("up_packets", "up_bytes", "up_drops", "down_packets", "down_bytes",
                  "down_drops")


@dataclass
class Topology:
    """A live topology: its plan, its hosts, and its links (None when unshaped)."""

    plan: TopologyPlan
    hosts: dict[str, Host]
    links: LinkBackend | None = None
    privilege: str = "root"
    #: What the topology recorded; users' programs started in it are recorded here too
    #: (testbed.net.programs), so they go with it, also after a crash (`testbed clean`).
    ledger: Ledger | None = None

    @property
    def socket_congestion_control(self) -> str | None:
        """The congestion control nodes must set on each socket themselves (in a user
        namespace the namespaces cannot default to a restricted one); None otherwise."""
        if self.privilege == "userns" and self.plan.profile.link is not None:
            return self.plan.profile.congestion_control
        return None

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    async def restart_trace(self) -> float:
        """Restart every link's trace clock at the offset (call at each episode start);
        returns replay time 0 as a time.monotonic() value."""
        if self.links is None:
            await trio.lowlevel.checkpoint()
            return time.monotonic()
        return await self.links.restart_trace()

    async def link_counters(self) -> dict[str, dict[str, int]]:
        """Per host: packets/bytes that left each direction, and drops (queue full + loss)."""
        if self.links is None:
            await trio.lowlevel.checkpoint()
            return {name: dict.fromkeys(_ZERO_COUNTERS, 0) for name in self.hosts}
        return await self.links.counters()

    async def link_statistics(self) -> dict[str, float]:
        """The backend's own health since the last clear (emulator lateness, errors)."""
        if self.links is None:
            await trio.lowlevel.checkpoint()
            return {}
        return await self.links.statistics()

    async def clear_link_statistics(self) -> None:
        if self.links is not None:
            await self.links.clear_statistics()

    async def start_link_log(self, directory: str, label: str) -> None:
        """Per-host, per-direction packet logs (Mahimahi format) into DIRECTORY."""
        if self.links is not None:
            await self.links.start_log(directory, label)

    async def stop_link_log(self) -> None:
        if self.links is not None:
            await self.links.stop_log()

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
            "privilege": self.privilege,
            "congestion_control_set_by": "socket" if self.socket_congestion_control
            else "namespace",
            "hosts": {h.name: {"netns": h.netns, "address": h.address,
                               **_link_summary(profile.link_of(h.name, i)),
                               **_cc_summary(profile, h.name, i)}
                      for i, h in enumerate(self.hosts.values())},
        }


def _link_summary(link: LinkSpec | None) -> dict[str, Any]:
    """What a host's own link is, for the manifest (the full definition is under the
    manifest's ``networks``)."""
    if link is None:
        return {}
    return {"up_trace": link.up_trace, "down_trace": link.down_trace,
            "up_rate_kbit": link.rate_of("up"), "down_rate_kbit": link.rate_of("down"),
            "delay_ms": link.delay_ms, "delay_trace": link.delay_trace}


def _cc_summary(profile: NetworkProfile, host: str, index: int) -> dict[str, Any]:
    """A host's own congestion control, when it has one (hosts.NAME.congestion_control)."""
    cc = profile.congestion_control_of(host, index)
    return {} if cc == profile.congestion_control else {"congestion_control": cc}


def _check_root(backend: str) -> None:
    if os.geteuid() != 0:
        raise HostError(f"backend {backend}: needs root or a user namespace of its own "
                        "(network namespaces); run as root, or through `testbed run`, which "
                        "enters one for unprivileged users")


def _setup_namespace(ledger: Ledger, host: Host, cc: str | None) -> None:
    """A host's namespace; ``cc`` becomes its default congestion control (None: the
    nodes set it per socket, see testbed.host.userns rule 4)."""
    assert host.netns is not None
    ledger.record_netns(host.netns)
    kernel.create_netns(host.netns)
    if cc is not None:
        kernel.set_sysctl(host.netns, "net.ipv4.tcp_congestion_control", cc)
    kernel.set_sysctl(host.netns, "net.ipv4.tcp_no_metrics_save", "1")
    kernel.disable_ipv6(host.netns)


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
    packet_log: bool = False,
    shared_emulator: bool = False,
) -> AsyncIterator[Topology]:
    """Build the topology, yield it, and remove everything it created on the way out.

    ``backend`` is what was asked for (``auto``, ``userspace``, ``netem``); an unshaped
    profile runs with none whatever was asked. ``packet_log``: the caller will ask for
    packet logs (``start_link_log``), so the backend must be able to write them.
    ``shared_emulator``: the userspace backend runs these hosts as a group of this
    process's one emulator (lanes; testbed.links.shared_emulator).
    """
    chosen = resolve_backend(profile, backend, packet_log=packet_log)
    plan = plan_topology(profile, agents, central=central, prefix=prefix,
                         trace_offset_s=trace_offset_s, backend=chosen)
    hosts = {h.name: h for h in plan.hosts}
    if plan.backend == NO_BACKEND:
        yield Topology(plan, hosts)
        return
    _check_root(plan.backend)
    mode = privilege()
    ledger = Ledger(plan.prefix)
    scope = trio.CancelScope()
    with cancel_on_sigterm(scope):
        try:
            with scope:
                # Per host (hosts.NAME.congestion_control); in a user namespace none: the
                # nodes set the network's on each socket.
                ccs = {h.name: profile.congestion_control_of(h.name, i) if mode == "root"
                       else None for i, h in enumerate(plan.hosts)}
                for cc in dict.fromkeys(c for c in ccs.values() if c is not None):
                    await trio.to_thread.run_sync(allow_congestion_control, ledger, cc)
                for host in plan.hosts:
                    await trio.to_thread.run_sync(_setup_namespace, ledger, host,
                                                  ccs[host.name])
                link_hosts = [LinkHost(h.name, str(h.netns), h.address) for h in plan.hosts]
                async with open_links(plan.backend, profile, link_hosts, prefix=plan.prefix,
                                      ledger=ledger, trace_offset_s=plan.trace_offset_s,
                                      seed=seed, packet_log=packet_log,
                                      shared_emulator=shared_emulator) as links:
                    yield Topology(plan, hosts, links, mode, ledger)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(partial(ledger.teardown))
    if scope.cancelled_caught:
        raise KeyboardInterrupt("SIGTERM: topology removed")


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
