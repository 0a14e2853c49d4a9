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
4. A token-bucket link (the netem backend's tbf) refills only when its dequeue timer
   fires, and keeps at most one frame plus ``catch_up_ms`` of its rate: a wake later
   than that loses the difference for good. A calibration also samples how late this
   machine's timers fire (``timer_lateness_ms``: sleeps of TIMER_SLEEP_MS, woken late
   by the kernel's timer, the scheduler and, in a guest, the host's descheduling of
   the virtual CPU: more than a kernel timer alone, so the floor errs low), and
   ``bucket_share`` replays those wakes in turn through the bucket to give the share of
   its rate such a link carries here. The floor of rule 3 for it is then the smaller
   of C x (1 - rel) x that share and the guest floor.
5. A rate is not testable when what the guest surely moves (the floor of rule 3 from
   its runs: lower when they spread, as when the machine's speed changed while it
   was measured) is below TESTABLE_FRACTION of it: the link would never run
   backlogged and the check would measure the CPU. ``untestable`` then gives the
   reason with the numbers, for a skip that says so.

Everything here but :func:`measure` and :func:`calibrate` is pure.
"""

from __future__ import annotations

import statistics
import time
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
TIMER_SAMPLES = 400
TIMER_SLEEP_MS = 1.0


@dataclass(frozen=True)
class Calibration:
    """The guest rate measured ``len(rates_kbit)`` times, and its timers (rules 2-5)."""

    rates_kbit: tuple[float, ...]
    rtts_ms: tuple[float, ...] = ()  # small-datagram round trips over the same path
    lateness_ms: tuple[float, ...] = ()  # how late timers woke, in turn (rule 4)

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

    def floor_kbit(self, capacity_kbit: float, rel: float, *,
                   catch_up_ms: float | None = None) -> float:
        """The least a backlogged link of ``capacity_kbit`` must carry here (a token
        bucket with ``catch_up_ms`` of catch-up: rule 4)."""
        share = 1.0
        if catch_up_ms is not None and self.lateness_ms:
            share = bucket_share(capacity_kbit, self.lateness_ms, catch_up_ms=catch_up_ms)
        return min(capacity_kbit * (1.0 - rel) * share, self.guest_floor_kbit())

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

    def lateness_quantile_ms(self, q: float) -> float | None:
        if not self.lateness_ms:
            return None
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def describe(self) -> str:
        runs = ", ".join(f"{r / 1000:.1f}" for r in self.rates_kbit)
        text = (f"{self.median_kbit / 1000:.1f} Mbit/s unshaped (median of {runs}; "
                f"spread {self.spread:.0%}, margin {self.margin:.0%})")
        if self.lateness_ms:
            text += (f"; timers late by {self.lateness_quantile_ms(0.5):.2f} ms median, "
                     f"{self.lateness_quantile_ms(0.99):.2f} ms p99, "
                     f"{max(self.lateness_ms):.1f} ms at most")
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"rates_kbit": [round(r, 1) for r in self.rates_kbit],
                "median_kbit": round(self.median_kbit, 1), "spread": round(self.spread, 4),
                "margin": round(self.margin, 4),
                "guest_floor_kbit": round(self.guest_floor_kbit(), 1),
                "rtts_ms": [round(r, 3) for r in self.rtts_ms],
                **{f"timer_late_{name}_ms": None if value is None else round(value, 4)
                   for name, value in (
                       ("p50", self.lateness_quantile_ms(0.5)),
                       ("p99", self.lateness_quantile_ms(0.99)),
                       ("max", max(self.lateness_ms, default=None)),
                       ("mean", statistics.fmean(self.lateness_ms) if self.lateness_ms
                        else None))}}


def bucket_share(capacity_kbit: float, lateness_ms: Sequence[float], *, catch_up_ms: float,
                 frame_bytes: int = FULL_IP_BYTES) -> float:
    """The share of ``capacity_kbit`` a backlogged token bucket carries when its dequeue
    timer fires late by each of ``lateness_ms`` in turn (rule 4). The bucket holds one
    frame plus ``catch_up_ms`` of the rate; it starts empty, sends every whole frame its
    tokens allow, and sleeps until the next frame's tokens are due, plus the lateness."""
    if capacity_kbit <= 0:
        raise ValueError(f"capacity_kbit: {capacity_kbit!r}; must be > 0")
    rate = capacity_kbit / 8.0  # bytes per ms
    bucket = frame_bytes + catch_up_ms * rate
    slack = 1e-9 * frame_bytes  # float rounding of a refill that is due exactly
    tokens = elapsed_ms = 0.0
    sent = 0
    for late in lateness_ms:
        while tokens >= frame_bytes - slack:
            tokens -= frame_bytes
            sent += 1
        wait_ms = (frame_bytes - tokens) / rate + max(0.0, late)
        elapsed_ms += wait_ms
        tokens = min(bucket, tokens + wait_ms * rate)
    if elapsed_ms == 0:
        return 1.0
    # the tokens still held are rate the bucket kept, not lost: only the cap loses any
    return min(1.0, (sent * frame_bytes + tokens) / (elapsed_ms * rate))


def timer_lateness_ms(samples: int = TIMER_SAMPLES, sleep_ms: float = TIMER_SLEEP_MS
                      ) -> tuple[float, ...]:
    """How late each of ``samples`` sleeps of ``sleep_ms`` woke (blocking, ~samples x
    sleep_ms)."""
    out = []
    for _ in range(samples):
        start = time.monotonic()
        time.sleep(sleep_ms / 1000.0)
        out.append(max(0.0, (time.monotonic() - start) * 1000.0 - sleep_ms))
    return tuple(out)


def merged(*calibrations: Calibration) -> Calibration:
    """One calibration of every run of several (e.g. before and after a check)."""
    return Calibration(tuple(r for c in calibrations for r in c.rates_kbit),
                       tuple(r for c in calibrations for r in c.rtts_ms),
                       tuple(r for c in calibrations for r in c.lateness_ms))


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
    return Calibration(tuple(rates), lateness_ms=timer_lateness_ms())


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
    return Calibration(measured.rates_kbit, tuple(ms), measured.lateness_ms)
