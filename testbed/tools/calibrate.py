"""How fast this machine itself moves datagrams through the testbed's links: the
calibration that a rate check needs on a slow machine (the VM lane's TCG guest).

Rules:

1. The *guest rate* is the rate at which full-size UDP datagrams cross an unshaped
   path of a topology (the same backend, namespaces, bridge and qdiscs, no rate
   limit), sent as fast as the sender can (``testbed.tools.udp_probe``, kernel receive
   timestamps): what the CPU allows, not the link (at most the 120 Mbit/s offered). A
   software-emulated CPU moves 9-23 Mbit/s this way depending on the host's other
   load; this machine's own, far more.
2. It is measured several times, right before and right after the check it serves; a
   :class:`Calibration` keeps every run. Its spread is (max - min) / median.
3. A shaped link of capacity C carries at most C x (1 + rel) whatever the machine
   (``ceiling_kbit``), and at least the smaller of C x (1 - rel) and what the guest
   surely moves: median x (1 - margin), margin = BASE_MARGIN + (median - slowest run)
   / median (``floor_kbit``), i.e. the slowest run less BASE_MARGIN of the median.
   BASE_MARGIN is what a rate-limited path costs the sender beyond the unshaped one;
   the rest of the margin comes from the calibration's own spread (how far its
   slowest run fell below its median), never from a constant tuned to pass.
4. A rate is not testable when what the guest surely moves (the floor of rule 3 from
   its runs: lower when they spread, as when the machine's speed changed while it
   was measured) is below TESTABLE_FRACTION of it: the link would never run
   backlogged and the check would measure the CPU. ``untestable`` then gives the
   reason with the numbers, for a skip that says so.

Everything here but :func:`measure` and :func:`calibrate` is pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.net.plan import Host
from testbed.net.topology import open_topology
from testbed.tools.echo_probe import open_echo_server, timed_exchanges
from testbed.tools.udp_probe import udp_stream

FULL_IP_BYTES = 1500
BASE_MARGIN = 0.10
TESTABLE_FRACTION = 0.5
RUN_DATAGRAMS = 1500
RUN_SKIP = 50  # the first arrivals are the stream's start, not its rate


@dataclass(frozen=True)
class Calibration:
    """The guest rate measured ``len(rates_kbit)`` times (rules 2-4)."""

    rates_kbit: tuple[float, ...]
    rtts_ms: tuple[float, ...] = ()  # small-datagram round trips over the same path

    def __post_init__(self) -> None:
        if not self.rates_kbit or min(self.rates_kbit) <= 0:
            raise ValueError(f"rates_kbit: {self.rates_kbit!r}; need at least one run > 0")

    @property
    def median_kbit(self) -> float:
        return float(statistics.median(self.rates_kbit))

    @property
    def spread(self) -> float:
        return (max(self.rates_kbit) - min(self.rates_kbit)) / self.median_kbit

    @property
    def margin(self) -> float:
        """The share of the median a check does not demand (rule 3)."""
        return BASE_MARGIN + (self.median_kbit - min(self.rates_kbit)) / self.median_kbit

    def guest_floor_kbit(self) -> float:
        return self.median_kbit * max(0.0, 1.0 - self.margin)

    def floor_kbit(self, capacity_kbit: float, rel: float) -> float:
        """The least a backlogged link of ``capacity_kbit`` must carry here."""
        return min(capacity_kbit * (1.0 - rel), self.guest_floor_kbit())

    @staticmethod
    def ceiling_kbit(capacity_kbit: float, rel: float) -> float:
        """The most any link of ``capacity_kbit`` may carry, on any machine."""
        return capacity_kbit * (1.0 + rel)

    def untestable(self, capacity_kbit: float) -> str | None:
        """Why a rate of ``capacity_kbit`` cannot be checked here (None: it can)."""
        if self.guest_floor_kbit() >= TESTABLE_FRACTION * capacity_kbit:
            return None
        return (f"guest too slow to test {capacity_kbit / 1000:.1f} Mbit/s: it surely moves "
                f"{self.guest_floor_kbit() / 1000:.1f} Mbit/s, below "
                f"{TESTABLE_FRACTION:.0%} of that rate ({self.describe()})")

    def describe(self) -> str:
        runs = ", ".join(f"{r / 1000:.1f}" for r in self.rates_kbit)
        return (f"{self.median_kbit / 1000:.1f} Mbit/s unshaped (median of {runs}; "
                f"spread {self.spread:.0%}, margin {self.margin:.0%})")

    def as_dict(self) -> dict[str, Any]:
        return {"rates_kbit": [round(r, 1) for r in self.rates_kbit],
                "median_kbit": round(self.median_kbit, 1), "spread": round(self.spread, 4),
                "margin": round(self.margin, 4),
                "guest_floor_kbit": round(self.guest_floor_kbit(), 1),
                "rtts_ms": [round(r, 3) for r in self.rtts_ms]}


def merged(*calibrations: Calibration) -> Calibration:
    """One calibration of every run of several (e.g. before and after a check)."""
    return Calibration(tuple(r for c in calibrations for r in c.rates_kbit),
                       tuple(r for c in calibrations for r in c.rtts_ms))


def measure(src: Host, dst: Host, *, runs: int, port: int = 9480,
            datagrams: int = RUN_DATAGRAMS) -> Calibration:
    """``runs`` greedy streams of full-size datagrams SRC -> DST over an unshaped path
    (blocking: run it in a thread)."""
    rates = []
    for i in range(runs):
        got = udp_stream(src, dst, count=datagrams, per_burst=100, interval_s=0.01,
                         ip_bytes=FULL_IP_BYTES, port=port + i, settle_s=0.3,
                         warm_up=True)
        rates.append(got.rate_kbit(FULL_IP_BYTES, skip=RUN_SKIP))
    return Calibration(tuple(rates))


def unshaped_hosts(profile: NetworkProfile, names: Sequence[str]) -> NetworkProfile:
    """``profile`` with hosts NAMES on an unshaped link (1 ms, no rate): the path a
    calibration runs on inside a test's own topology."""
    plain = LinkSpec(delay_ms=1.0)
    return NetworkProfile(profile.name, profile.link, profile.congestion_control,
                          (*profile.hosts, *((n, plain) for n in names)),
                          profile.description)


async def calibrate(backend: str, *, runs: int = 5, rtts: int = 20) -> Calibration:
    """The guest rate and round trip of this machine on BACKEND (two hosts on an
    unshaped 1 ms link): what ``testbed bench calibrate`` prints."""
    profile = NetworkProfile("calibration", LinkSpec(delay_ms=1.0))
    async with open_topology(profile, ["u0", "u1"], backend=backend) as topo:
        a, b = topo.hosts["u0"], topo.hosts["u1"]
        measured = await trio.to_thread.run_sync(lambda: measure(a, b, runs=runs))
        async with open_echo_server(b):
            _, ms = await timed_exchanges(a, b, 100, 100, count=rtts, fresh=False)
    return Calibration(measured.rates_kbit, tuple(ms))
