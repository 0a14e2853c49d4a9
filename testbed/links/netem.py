"""The kernel link backend: veth pairs, a bridge, and tc netem + tbf per direction.

Rules:

- Topology: one veth pair per host between the host's namespace and a switch namespace
  that bridges all pairs. The host end's egress is the host's uplink; the switch end's
  egress is the host's downlink. A->B traffic therefore crosses A's uplink then B's
  downlink, as in the userspace backend.
- Each direction gets `netem` as the root qdisc (one-way `delay_ms`, `loss_pct` or a
  Gilbert-Elliott `gemodel`) and, for rate-limited links, a `tbf` child whose rate
  follows the schedule. The drop-tail bound is tbf's byte limit in frames
  (``netem_plan.limit_frame_bytes``); a CoDel queue is a `codel` qdisc under tbf.
- Each host's directions are planned from its own link (``NetworkProfile.link_of``). A
  network netem cannot express is refused before this module is reached
  (``testbed.links.netem_support``); packet logs (``start_log``) are userspace's only.
- A capacity trace is compiled into one rate per fixed interval
  (``testbed.links.netem_plan``), and a trio task changes each tbf's rate at the
  interval boundaries (pyroute2 calls run in a worker thread). A loop that falls
  behind plays the step in force now and skips the ones past, so the replay keeps to
  real time; ``statistics()`` reports how late the changes were and what was skipped.
- Deviations from mm-link, documented in docs/links.md: the rate is averaged over an
  interval; every rate change refills tbf's bucket (one burst passes). The packet meets
  the delay before the rate limiter (netem is the parent); a direction whose ``order``
  puts the delay after the link replays its trace that much later, which is the same
  (``netem_plan`` rules).
- Everything created carries the run prefix and is recorded in the run's ledger before
  it is created, so `testbed clean` can remove it after a crash. Kernel errors are
  raised as `KernelError` (an OSError keeping the kernel's errno).

The backend needs root and the kernel's sch_netem and sch_tbf.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import trio

from testbed.errors import UserError
from testbed.host.kernel import KernelError, kernel_call
from testbed.host.ledger import Ledger
from testbed.links import netem_loss, netem_qdiscs
from testbed.links.backend import FaultUnsupported, LinkHost
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.netem_plan import (
    DEFAULT_INTERVAL_MS,
    ZERO_RATE_FLOOR_KBIT,
    DirectionPlan,
    ReplayLateness,
    compile_schedule,
    plan_direction,
    root_counters,
    tbf_params,
)
from testbed.links.netem_probes import netem_available as netem_available
from testbed.links.netem_probes import probe_qdisc as probe_qdisc
from testbed.links.netem_probes import probes as probes
from testbed.links.netem_probes import scratch_veth as scratch_veth
from testbed.links.traces import Trace, load_trace_ref

NAME = "netem"
PROBE_NAMES = ("veth", "netem", "tbf")
T = TypeVar("T")
_IFNAME_MAX = 15

# ----------------------------------------------------------------- kernel helpers


def _kernel(operation: str, fn: Callable[[], T]) -> T:
    """Run one pyroute2 call; failures become KernelError with the kernel's errno."""
    return kernel_call(operation, fn)


# ----------------------------------------------------------------- the backend


@dataclass
class _Direction:
    host: str
    side: str  # "up" (host end) or "down" (switch end)
    netns: str
    ifname: str
    plan: DirectionPlan
    index: int = 0
    current_kbit: float | None = None


class NetemBackend:
    """veth pairs to a switch namespace, netem + tbf per direction, schedule-driven rates.

    Synchronous methods block on netlink: call them through `trio.to_thread.run_sync`
    (or use `open_netem_links`, which does).
    """

    def __init__(
        self,
        profile: NetworkProfile,
        *,
        prefix: str,
        ledger: Ledger | None = None,
        trace_offset_ms: float = 0.0,
        interval_ms: float = DEFAULT_INTERVAL_MS,
    ) -> None:
        if profile.link is None:
            raise ValueError("profile: loopback has no link; the netem backend needs a shaped profile")
        if not (math.isfinite(interval_ms) and interval_ms >= 1):
            raise ValueError(f"interval_ms: must be a number >= 1, got {interval_ms!r}")
        if not (math.isfinite(trace_offset_ms) and trace_offset_ms >= 0):
            raise ValueError(f"trace_offset_ms: must be a number >= 0, got {trace_offset_ms!r}")
        self.profile = profile
        self.link: LinkSpec = profile.link
        self.prefix = prefix
        self.ledger = ledger
        self.trace_offset_ms = trace_offset_ms
        self.interval_ms = interval_ms
        self.switch_ns = f"{prefix}sw"
        self.bridge = f"{prefix}br"
        self._directions: list[_Direction] = []
        self._iprs: dict[str, Any] = {}
        self._created_switch = False
        self._replay_scope: trio.CancelScope | None = None
        self._replay_zero: float | None = None  # trio time of replay time 0, once restarted
        self._lateness = ReplayLateness()
        self._lock = threading.Lock()  # one netlink user at a time (rates vs counters)

    # -- build / teardown (blocking) --

    def _ipr(self, netns: str) -> Any:
        from pyroute2 import IPRoute

        if netns not in self._iprs:
            self._iprs[netns] = _kernel(f"open netlink in {netns}", lambda: IPRoute(netns=netns))
        return self._iprs[netns]

    def describe(self, hosts: Sequence[LinkHost]) -> list[tuple[str, str, str, DirectionPlan]]:
        """Pure: (host, side, interface, plan) for every direction `build` will create."""
        if len(f"{self.prefix}d{max(len(hosts) - 1, 0)}") > _IFNAME_MAX:
            raise ValueError(f"prefix: too long for interface names, got {self.prefix!r}")
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"hosts: names must be unique, got {names}")
        out: list[tuple[str, str, str, DirectionPlan]] = []
        for i, (host, link) in enumerate(zip(hosts, self.profile.links_of(names), strict=True)):
            assert link is not None
            out.append((host.name, "up", f"{self.prefix}u{i}", plan_direction(link, "up")))
            out.append((host.name, "down", f"{self.prefix}d{i}", plan_direction(link, "down")))
        return out

    def build(self, hosts: Sequence[LinkHost]) -> None:
        """Create the switch namespace, bridge, one veth pair per host, and the qdiscs."""
        netns_of = {h.name: h.netns for h in hosts}
        self._directions = [
            _Direction(host=host, side=side, ifname=ifname, plan=plan,
                       netns=netns_of[host] if side == "up" else self.switch_ns)
            for host, side, ifname, plan in self.describe(hosts)  # validates first
        ]
        self._create(hosts)

    def _create(self, hosts: Sequence[LinkHost]) -> None:
        from pyroute2 import netns as pr_netns

        from testbed.host import kernel

        if self.ledger is not None:
            self.ledger.record_netns(self.switch_ns)
        _kernel(f"create netns {self.switch_ns}", lambda: pr_netns.create(self.switch_ns))
        self._created_switch = True
        kernel.disable_ipv6(self.switch_ns)  # before its bridge and veths exist
        sw = self._ipr(self.switch_ns)
        _kernel(f"add bridge {self.bridge}", lambda: sw.link("add", ifname=self.bridge, kind="bridge"))
        br_index = _kernel("lookup bridge", lambda: sw.link_lookup(ifname=self.bridge))[0]
        _kernel("bridge up", lambda: sw.link("set", index=br_index, state="up"))
        for i, host in enumerate(hosts):
            self._build_host(i, host, br_index)

    def _build_host(self, i: int, host: LinkHost, br_index: int) -> None:
        sw = self._ipr(self.switch_ns)
        up_if, down_if = f"{self.prefix}u{i}", f"{self.prefix}d{i}"
        if self.ledger is not None:
            self.ledger.record_link(down_if, self.switch_ns)  # deleting one end removes both
        _kernel(f"add veth {up_if}/{down_if}",
                lambda: sw.link("add", ifname=down_if, kind="veth", peer=up_if))
        up_index = _kernel(f"lookup {up_if}", lambda: sw.link_lookup(ifname=up_if))[0]
        _kernel(f"move {up_if} to {host.netns}",
                lambda: sw.link("set", index=up_index, net_ns_fd=host.netns))
        down_index = _kernel(f"lookup {down_if}", lambda: sw.link_lookup(ifname=down_if))[0]
        _kernel(f"enslave {down_if}", lambda: sw.link("set", index=down_index, master=br_index))
        _kernel(f"set {down_if} up", lambda: sw.link("set", index=down_index, state="up"))

        hn = self._ipr(host.netns)
        lo = _kernel("lookup lo", lambda: hn.link_lookup(ifname="lo"))[0]
        _kernel(f"{host.netns}: lo up", lambda: hn.link("set", index=lo, state="up"))
        index = _kernel(f"lookup {up_if}", lambda: hn.link_lookup(ifname=up_if))[0]
        _kernel(f"{host.netns}: address {host.address}",
                lambda: hn.addr("add", index=index, address=host.address, prefixlen=15))
        _kernel(f"{host.netns}: {up_if} up", lambda: hn.link("set", index=index, state="up"))

        for d in self._directions:
            if d.host == host.name:
                d.index = index if d.side == "up" else down_index
                self._install_qdiscs(d)

    def _install_root(self, ipr: Any, d: _Direction, where: str) -> None:
        """Root qdisc `1:` (netem: delay, loss); a shaping child attaches at `1:1`."""
        _kernel(f"add netem on {where}",
                lambda: ipr.tc("add", "netem", d.index, handle="1:0", **d.plan.netem_params()))

    def _install_qdiscs(self, d: _Direction) -> None:
        ipr = self._ipr(d.netns)
        where = f"{d.ifname} in {d.netns}"
        self._install_root(ipr, d, where)
        if d.plan.shaped:
            rate = d.plan.rate_kbit if d.plan.rate_kbit is not None else ZERO_RATE_FLOOR_KBIT
            _kernel(f"add tbf on {where}",
                    lambda: ipr.tc("add", "tbf", d.index, handle="10:0", parent="1:1",
                                   **tbf_params(rate, limit_bytes=d.plan.limit_bytes)))
            d.current_kbit = rate
            self._install_leaf(ipr, d, where)

    def _install_leaf(self, ipr: Any, d: _Direction, where: str) -> None:
        """The queue under tbf when it is not tbf's own fifo (CoDel)."""
        leaf = d.plan.leaf_params()
        if leaf is not None:
            kind, params = leaf
            _kernel(f"add {kind} on {where}",
                    lambda: ipr.tc("add", kind, d.index, handle="20:0", parent="10:1",
                                   **params))

    def set_rates(self, changes: Sequence[tuple[int, float]]) -> None:
        """Apply (direction index, rate_kbit) changes; blocking netlink calls."""
        with self._lock:
            self._set_rates(changes)

    def _set_rates(self, changes: Sequence[tuple[int, float]]) -> None:
        from testbed.host.qdisc import QdiscChanges  # encoded once per rate (its doc)

        for i, rate_kbit in changes:
            d = self._directions[i]
            tc = self._iprs.get(f"tc {d.netns}") or self._iprs.setdefault(
                f"tc {d.netns}", QdiscChanges(d.netns))  # closed with the IPRoutes
            _kernel(f"change tbf on {d.ifname} in {d.netns}",
                    partial(tc.change, "tbf", d.index, handle=0x100000, parent=0x10001,
                            **tbf_params(rate_kbit, limit_bytes=d.plan.limit_bytes)))
            if (d.current_kbit or 0.0) <= ZERO_RATE_FLOOR_KBIT < rate_kbit:  # tbf sleeps on
                _kernel(f"kick {d.ifname}", partial(tc.kick, d.ifname))  # its old timer
            d.current_kbit = rate_kbit

    @property
    def name(self) -> str:
        return NAME

    async def counters(self) -> dict[str, dict[str, int]]:
        """Per host: packets/bytes sent and drops per direction (``read_counters``)."""
        counters: dict[str, dict[str, int]] = await trio.to_thread.run_sync(self.read_counters)
        return counters

    async def statistics(self) -> dict[str, float]:
        """The replay's lateness since the last clear (``netem_plan.ReplayLateness``)."""
        await trio.lowlevel.checkpoint()
        return self._lateness.snapshot()

    async def fault(self, host: str, kind: str, *, seconds: float, rate: float = 1.0
                    ) -> dict[str, int]:
        raise FaultUnsupported(f"fault {kind!r}: the netem backend injects no faults; "
                               "use --backend userspace")

    async def clear_statistics(self) -> None:
        self._lateness.clear()
        await trio.lowlevel.checkpoint()

    async def start_log(self, directory: str, label: str) -> None:
        raise UserError("options.link_log: the netem backend keeps no packet log; use "
                        "backend userspace")

    async def stop_log(self) -> None:
        await trio.lowlevel.checkpoint()

    def read_counters(self) -> dict[str, dict[str, int]]:
        """Per host: packets/bytes sent and drops per direction, from the kernel's stats."""
        with self._lock:
            return self._counters()

    def _counters(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for d in self._directions:
            ipr = self._ipr(d.netns)
            qdiscs = _kernel(f"qdiscs of {d.ifname}", partial(ipr.get_qdiscs, index=d.index))
            row = out.setdefault(d.host, {})
            for key, value in root_counters(qdiscs).items():
                row[f"{d.side}_{key}"] = value
        return out

    def teardown(self) -> None:
        """Remove the switch namespace (its veth ends take the host ends with them)."""
        from pyroute2 import netns as pr_netns

        try:
            for ipr in self._iprs.values():
                with contextlib.suppress(OSError):
                    ipr.close()
            self._iprs.clear()
            if self._created_switch:
                try:
                    pr_netns.remove(self.switch_ns)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.EINVAL):
                        raise KernelError(exc.errno or errno.EIO, f"remove netns {self.switch_ns}") from exc
                self._created_switch = False
        finally:
            self._directions.clear()

    # -- schedule (trio) --

    def _traces(self) -> list[Trace | None]:
        return [None if d.plan.trace is None else load_trace_ref(d.plan.trace, "up" if
                d.side == "up" else "down") for d in self._directions]

    async def run_schedule(self, *, chunk_ms: float = 10_000.0) -> None:
        """Replay every traced direction's schedule until cancelled; restartable.

        Steps are compiled `chunk_ms` at a time (the trace wraps forever); a change is
        sent only when a direction's rate differs from what it has. `restart_trace()`
        starts the replay again at the trace offset (each episode starts there, so
        paired episodes see the same capacity).
        """
        if chunk_ms < self.interval_ms or not math.isclose(
                chunk_ms / self.interval_ms, round(chunk_ms / self.interval_ms)):
            raise ValueError(f"chunk_ms: must be a multiple of interval_ms, got {chunk_ms!r}")
        await self._run_schedule(chunk_ms)

    async def _run_schedule(self, chunk_ms: float) -> None:
        while True:
            with trio.CancelScope() as scope:
                self._replay_scope = scope
                await self._replay(chunk_ms)
            self._replay_scope = None

    async def restart_trace(self) -> float:
        """Restart the replay clock at the trace offset (no-op before `run_schedule`);
        returns the restart time as a time.monotonic() value."""
        now = time.monotonic()
        # replay time 0 is this instant, not when the replay task gets going again: it
        # may first wait for a rate change in flight and load its traces (in the VM
        # lane's guest that took long enough to shift the schedule by a good part of a
        # second); the steps due meanwhile are caught up (netem_replay)
        if self._replay_scope is not None:
            self._replay_zero = trio.current_time()
            self._replay_scope.cancel()
        await trio.lowlevel.checkpoint()
        return now

    async def _replay(self, chunk_ms: float) -> None:
        from testbed.links.netem_replay import play_steps  # catches up when late

        traces = self._traces()
        if all(t is None for t in traces):
            await trio.sleep_forever()
        start = self._replay_zero if self._replay_zero is not None else trio.current_time()
        for chunk in itertools.count():
            chunk_start = chunk * chunk_ms
            per_direction = [
                None if t is None else compile_schedule(
                    t, offset_ms=(self.trace_offset_ms + d.plan.offset_ms  # order: plan rules
                                  - d.plan.schedule_shift_ms) % t.period_ms,
                    start_ms=chunk_start,
                    interval_ms=self.interval_ms, duration_ms=chunk_ms)
                for t, d in zip(traces, self._directions, strict=True)
            ]
            n_steps = max(len(s) for s in per_direction if s is not None)
            await play_steps(per_direction, n_steps, start + chunk_start / 1000.0,
                             interval_ms=self.interval_ms, apply=self._apply_changes,
                             rates=lambda: [d.current_kbit for d in self._directions],
                             lateness=self._lateness)

    async def _apply_changes(self, changes: list[tuple[int, float]]) -> None:
        await trio.to_thread.run_sync(self.set_rates, changes)


@contextlib.asynccontextmanager
async def open_netem_links(
    profile: NetworkProfile,
    hosts: Sequence[LinkHost],
    *,
    prefix: str,
    ledger: Ledger | None = None,
    trace_offset_s: float = 0.0,
    seed: int = 0,
    interval_ms: float = DEFAULT_INTERVAL_MS,
    shared_emulator: bool = False,
) -> AsyncIterator[NetemBackend]:
    """Build the netem links for `hosts`, replay the schedule while open, tear down on exit.

    Fails fast (KernelError with the errno) when the kernel lacks netem or tbf; it never
    yields an unshaped link. (``seed`` and ``shared_emulator`` are accepted for the
    common interface: the kernel's loss draws are its own, and there is no emulator.)
    """
    netem_loss.install()  # gemodel loss over netlink (pyroute2 lacks TCA_NETEM_LOSS)
    netem_qdiscs.install()  # pie and pfifo_head_drop leaves
    backend = NetemBackend(profile, prefix=prefix, ledger=ledger,
                           trace_offset_ms=trace_offset_s * 1000.0, interval_ms=interval_ms)
    try:
        await trio.to_thread.run_sync(backend.build, hosts)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(backend.run_schedule)
                try:
                    yield backend
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the body's error as itself, as userspace's
            raise (group.exceptions[0] if len(group.exceptions) == 1 else group) from None
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(backend.teardown)

