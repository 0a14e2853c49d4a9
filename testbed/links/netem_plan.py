"""The netem backend's pure half: traces compiled into rate steps, qdisc parameters.

Nothing here touches the kernel (``testbed.links.netem`` applies these plans).

- A capacity trace cannot be replayed packet by packet by the kernel; it is compiled
  into one rate per fixed interval (:func:`compile_schedule`). Intervals with no
  opportunity are explicit zero steps; tbf cannot take a zero rate, so they are applied
  as :data:`ZERO_RATE_FLOOR_KBIT`, slow enough that nothing but the bucket's burst leaves.
- Each direction is planned from its own side of the link (``LinkSpec.side``: its
  delay, loss and queue) as netem (one-way ``delay_ms``, ``loss_pct`` or a
  Gilbert-Elliott ``gemodel``) with a tbf child for rate-limited links; the drop-tail
  bound is tbf's byte limit, counted in Ethernet frames (IP packet + 14 bytes, what the
  qdisc sees on a veth): ``queue_packets`` full frames, and at most ``queue_bytes`` of
  IP bytes scaled to frames (:func:`limit_frame_bytes`). Other queues are a qdisc
  under tbf that holds the queue, bounded in packets: ``pfifo_head_drop``
  (drop-head), ``codel``, ``pie``, ``fq_codel`` (:meth:`DirectionPlan.leaf_params`).
- netem delays before tbf shapes, so the kernel is ``delay_then_link`` by
  construction. A direction whose order is ``link_then_delay`` replays its trace
  ``delay_ms`` later (:attr:`DirectionPlan.schedule_shift_ms`): with a fixed delay,
  queueing at a trace then waiting d is exactly waiting d then queueing at the trace
  shifted by d (same departures, same drops).
- Every host is planned from its own link (``NetworkProfile.link_of``).
- :func:`unsupported` says which field of a network netem cannot express (a delay
  trace, a byte bound on a queue other than drop-tail); the backend refuses such a
  network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.links.linkspec import LinkSpec, NetworkProfile, QueueSpec
from testbed.links.traces import MTU_BYTES, Trace, kbit_per_opportunity_ms

DEFAULT_INTERVAL_MS = 10.0
"""Rate-change interval; ten changes per second per direction per host."""

ZERO_RATE_FLOOR_KBIT = 8.0
"""tbf rate standing for zero capacity (1000 B/s: a 1500-byte packet needs 1.5 s)."""

NETEM_DELAY_LIMIT_PACKETS = 100_000
"""netem's own FIFO only holds packets in flight for the delay; it must never drop."""

FRAME_OVERHEAD_BYTES = 14
"""Ethernet header a veth qdisc counts on top of the IP packet."""


# ----------------------------------------------------------------- pure: schedule compiler


@dataclass(frozen=True)
class RateStep:
    """From replay time `t_ms` until the next step the link carries `rate_kbit` (0 = outage)."""

    t_ms: float
    rate_kbit: float


def compile_schedule(
    trace: Trace,
    *,
    offset_ms: float,
    interval_ms: float,
    duration_ms: float,
    start_ms: float = 0.0,
) -> list[RateStep]:
    """One step per interval over [start_ms, start_ms + duration_ms) of replay time.

    Replay time 0 is trace time `offset_ms`. Each step's rate is what the trace's
    opportunities in that interval can carry (1500 bytes each); the last interval may
    be shorter and uses its real width. Compiling a long replay in consecutive pieces
    (`start_ms` = 0, d, 2d, ...) gives exactly the steps of compiling it whole.
    """
    for field_name, value in (("interval_ms", interval_ms), ("duration_ms", duration_ms)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{field_name}: must be a finite number > 0, got {value!r}")
    for field_name, value in (("offset_ms", offset_ms), ("start_ms", start_ms)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{field_name}: must be a finite number >= 0, got {value!r}")
    import numpy as np  # here, not with the module: fixed links need no trace arrays

    n_steps = math.ceil(duration_ms / interval_ms - 1e-9)
    end_ms = start_ms + duration_ms
    edges = np.minimum(start_ms + np.arange(n_steps + 1, dtype=np.float64) * interval_ms, end_ms)
    opportunities = trace.opportunities(start_ms, end_ms, offset_ms)
    # counts[i] = opportunities in [edges[i], edges[i+1])
    positions = np.searchsorted(opportunities, edges, side="left")
    counts = np.diff(positions)
    widths = np.diff(edges)
    return [
        RateStep(t_ms=float(edges[i]), rate_kbit=kbit_per_opportunity_ms(int(counts[i]), float(widths[i])))
        for i in range(n_steps)
    ]


# ----------------------------------------------------------------- pure: replay bookkeeping

LATE_BIN_MS = 0.1
LATE_BINS = 5000
"""Lateness histogram: 0.1 ms bins up to 500 ms; later changes land in the last bin
(the maximum stays exact)."""


def current_step(elapsed_ms: float, interval_ms: float) -> int:
    """Index of the step in force ELAPSED_MS after the first step's due time."""
    return math.floor(elapsed_ms / interval_ms + 1e-9)


def step_changes(per_direction: Sequence[Sequence[RateStep] | None], k: int,
                 rates_kbit: Sequence[float | None]) -> list[tuple[int, float]]:
    """(direction, rate) for each direction whose step K differs from its rate now."""
    return [(i, steps[k].rate_kbit) for i, steps in enumerate(per_direction)
            if steps is not None and k < len(steps) and rates_kbit[i] != steps[k].rate_kbit]


@dataclass
class ReplayLateness:
    """How late the replay's rate changes took effect, and how many steps it skipped.

    A step's lateness runs from its due time to the return of its last netlink call
    (when the new rates are in force). ``snapshot()`` has the keys the userspace
    emulator reports where they mean the same (``late_p50_ms``, ``late_p99_ms``,
    ``late_max_ms``; 0 with nothing recorded) and the replay's own (``rate_changes``:
    steps that changed a rate, ``steps_skipped``: steps already past when the loop
    woke, never applied).
    """

    histogram: list[int] = field(default_factory=lambda: [0] * LATE_BINS)
    max_ms: float = 0.0
    changes: int = 0
    skipped: int = 0

    def record(self, late_ms: float) -> None:
        late_ms = max(0.0, late_ms)
        self.histogram[min(int(late_ms / LATE_BIN_MS), LATE_BINS - 1)] += 1
        self.max_ms = max(self.max_ms, late_ms)
        self.changes += 1

    def catch_up(self, k: int, now_k: int, n_steps: int) -> int:
        """The step to play next when step K is due and step NOW_K is in force, in a
        chunk of N_STEPS (N_STEPS: the chunk is over); the steps jumped are skipped."""
        target = min(max(k, now_k), n_steps)
        self.skipped += target - k
        return target

    def clear(self) -> None:
        self.histogram = [0] * LATE_BINS
        self.max_ms = 0.0
        self.changes = self.skipped = 0

    def quantile_ms(self, q: float) -> float:
        """Upper edge of the bin holding quantile Q, at most the maximum (0 if empty)."""
        seen = 0
        for i, n in enumerate(self.histogram):
            seen += n
            if n and seen >= q * self.changes:
                return min((i + 1) * LATE_BIN_MS, self.max_ms)
        return 0.0

    def snapshot(self) -> dict[str, float]:
        return {
            "late_p50_ms": round(self.quantile_ms(0.5), 3),
            "late_p99_ms": round(self.quantile_ms(0.99), 3),
            "late_max_ms": round(self.max_ms, 3),
            "rate_changes": float(self.changes),
            "steps_skipped": float(self.skipped),
        }


# ----------------------------------------------------------------- pure: qdisc parameters

ETHERNET_HEADER_BYTES = 14
FRAME_BYTES = MTU_BYTES + ETHERNET_HEADER_BYTES
"""A full-size frame as a veth's qdisc counts it (IP packet + Ethernet header)."""

PSCHED_TICKS_PER_US = 1000 / 64
"""pyroute2's `tick_in_usec` from /proc/net/psched (1000 ns per us, 64 ns per tick:
PSCHED_SHIFT 6, the same on every kernel since 2.6.31)."""


def pyroute2_buffer_ticks(rate_bytes_s: int, burst_bytes: int, *,
                          ticks_per_us: float = PSCHED_TICKS_PER_US) -> int:
    """tbf's `buffer` as pyroute2 encodes it (``tcmsg.common.calc_xmittime``, ported
    from tc): the burst's transmission time truncated to whole microseconds, then to
    whole psched ticks."""
    return int(int(1_000_000 * (float(burst_bytes) / rate_bytes_s)) * ticks_per_us)


def kernel_tbf_max_size(rate_bytes_s: int, buffer_ticks: int) -> int:
    """The largest packet tbf passes (`max_size` in sch_tbf.c `tbf_change`) for a
    buffer of BUFFER_TICKS, when no TCA_TBF_BURST is sent (pyroute2 sends none):
    ``psched_ns_t2l(rate, min(ticks << 6, 2**32 - 1))`` on an Ethernet link layer with
    no overhead, i.e. the bytes the rate moves in the buffer time, rounded down."""
    buffer_ns = min(buffer_ticks << 6, 2**32 - 1)
    return buffer_ns * rate_bytes_s // 1_000_000_000


def kernel_tbf_burst(rate_bytes_s: int, burst_bytes: int) -> int:
    """What tbf ends up with (its `max_size`, bytes) when asked for BURST_BYTES."""
    return kernel_tbf_max_size(rate_bytes_s, pyroute2_buffer_ticks(rate_bytes_s, burst_bytes))


CATCH_UP_MS = 1.0
"""How late tbf's dequeue timer may fire before a backlogged link loses capacity.

tbf caps its tokens at the bucket: with a bucket of exactly one frame, a queue waiting
for the next frame's tokens sends it when the watchdog timer fires, and every
microsecond the timer is late is capacity lost for good (the bucket could not hold the
tokens that accrued meanwhile). A software-emulated guest fires it ~0.4 ms late: the
VM lane's backlogged links carried 66-76% of 12 Mbit/s (a frame per ms) and 87-93% of
3.3 Mbit/s (a frame per 3.6 ms), the same ~0.4 ms lost per frame. A bucket of one frame
plus CATCH_UP_MS of the rate keeps those tokens, so the link catches up as mm-link's
release loop does. The price: after idling, or at a rate change (which refills the
bucket), that much more passes at once (docs/links.md)."""


def tbf_burst_request(rate_bytes_s: int) -> int:
    """The burst to ask for so that the kernel keeps one full frame plus CATCH_UP_MS of
    the rate.

    Each truncation loses less than one unit: under 1 us, under one 64 ns tick, under
    one byte, so the kernel keeps more than ``burst - 1.064e-6 * rate - 1`` bytes;
    padding by ``ceil(1.064e-6 * rate)`` is enough (checked exactly, and padded more
    where float rounding would ever disagree).
    """
    want = FRAME_BYTES + math.ceil(rate_bytes_s * CATCH_UP_MS / 1000)
    burst = want + math.ceil(rate_bytes_s * 1064 / 1_000_000_000)
    while kernel_tbf_burst(rate_bytes_s, burst) < want:
        burst += 1
    return burst


TC_H_ROOT = 0xFFFFFFFF


def root_counters(qdiscs: Sequence[Any]) -> dict[str, int]:
    """packets, bytes and drops of one direction from its root qdisc (netem), given the
    pyroute2 qdisc messages of the device. The root counts what left it after its
    children (tbf) and every drop below it once (children's drops too, so summing the
    qdiscs would count a tbf drop twice); packets as segments, bytes as IP bytes (the
    qdisc counts a 14-byte Ethernet header per segment), as the emulator counts them."""
    root = [q for q in qdiscs if q["parent"] == TC_H_ROOT]
    stats = (root[0].get_attr("TCA_STATS") if root else None) or {}
    packets = int(stats.get("packets", 0))
    return {"packets": packets, "bytes": int(stats.get("bytes", 0)) - ETHERNET_HEADER_BYTES * packets,
            "drops": int(stats.get("drop", 0))}


def tbf_params(rate_kbit: float, *, limit_bytes: int) -> dict[str, int]:
    """pyroute2 `tbf` arguments: rate in bytes/s, a burst that stays at least one full
    frame plus CATCH_UP_MS of rate after the kernel's rounding (:func:`tbf_burst_request`)."""
    effective_kbit = max(rate_kbit, ZERO_RATE_FLOOR_KBIT)
    rate_bytes_s = max(1, round(effective_kbit * 1000 / 8))
    burst = tbf_burst_request(rate_bytes_s)
    return {"rate": rate_bytes_s, "burst": burst, "limit": max(limit_bytes, burst)}


def limit_frame_bytes(queue_packets: int, queue_bytes: int | None) -> int:
    """tbf's byte limit for a drop-tail bound of QUEUE_PACKETS packets and at most
    QUEUE_BYTES IP bytes: exact for full-size packets (frames of 1514 bytes)."""
    frame = MTU_BYTES + FRAME_OVERHEAD_BYTES
    limit = queue_packets * frame
    if queue_bytes is not None:
        limit = min(limit, math.ceil(queue_bytes * frame / MTU_BYTES))
    return limit


def percent_u32(pct: float) -> int:
    """A percentage as netem's u32 probability (0 -> 0, 100 -> 2**32 - 1)."""
    return int((2**32 - 1) * pct / 100)


@dataclass(frozen=True)
class DirectionPlan:
    """Qdiscs of one direction of one host link, before anything touches the kernel."""

    delay_ms: float
    loss_pct: float
    limit_bytes: int
    trace: str | None  # rate follows this trace's schedule
    rate_kbit: float | None  # fixed rate; None with trace None = delay only
    gilbert: tuple[float, float, float, float] | None = None  # p, r, good %, bad %
    codel: tuple[int, float, float] | None = None  # limit packets, target ms, interval ms
    offset_ms: float = 0.0  # the link's own trace offset, added to the backend's
    queue: QueueSpec = field(default_factory=QueueSpec)
    delay_first: bool = True  # the kernel's own order (module rules)

    @property
    def schedule_shift_ms(self) -> float:
        """How much later than the episode's trace clock this direction's schedule plays
        (``link_then_delay``: its delay; module rules)."""
        return 0.0 if self.delay_first else self.delay_ms

    @property
    def shaped(self) -> bool:
        return self.trace is not None or self.rate_kbit is not None

    def netem_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "delay": round(self.delay_ms * 1000),  # microseconds
            "loss": self.loss_pct,
            "limit": NETEM_DELAY_LIMIT_PACKETS,
        }
        if self.gilbert is not None:
            params["gemodel"] = gemodel_params(*self.gilbert)
        return params

    def leaf_params(self) -> tuple[str, dict[str, Any]] | None:
        """The queue qdisc under tbf (None: tbf's own byte-limited fifo); times in us."""
        q = self.queue
        if q.kind == "droptail":
            return None
        if q.kind == "drophead":
            return "pfifo_head_drop", {"limit": q.packets}
        if q.kind == "codel":
            return "codel", {"cdl_limit": q.packets, "cdl_target": round(q.target_ms * 1000),
                             "cdl_interval": round(q.interval_ms * 1000)}
        if q.kind == "pie":
            return "pie", {"limit": q.packets, "target": round(q.target_ms * 1000),
                           "tupdate": round(q.tupdate_ms * 1000)}
        return "fq_codel", {"fqc_limit": q.packets, "fqc_target": round(q.target_ms * 1000),
                            "fqc_interval": round(q.interval_ms * 1000),
                            "fqc_flows": q.flows}


def gemodel_params(p: float, r: float, loss_good_pct: float, loss_bad_pct: float,
                   ) -> dict[str, int]:
    """netem ``loss gemodel p r 1-h 1-k`` as the kernel's u32 fields (h: no loss in bad)."""
    return {"p": percent_u32(p * 100), "r": percent_u32(r * 100),
            "h": percent_u32(100 - loss_bad_pct), "k1": percent_u32(loss_good_pct)}


def plan_direction(link: LinkSpec, direction: str) -> DirectionPlan:
    """Describe one direction ('up' or 'down') of an access link."""
    if direction not in ("up", "down"):
        raise ValueError(f"direction: must be 'up' or 'down', got {direction!r}")
    side = link.side(direction)
    g = side.gilbert
    q = side.queue
    return DirectionPlan(
        delay_ms=side.delay_ms,
        loss_pct=side.loss_pct,
        limit_bytes=limit_frame_bytes(q.packets, q.bytes),
        trace=side.trace,
        rate_kbit=side.rate_kbit,
        gilbert=None if g is None else (g.p, g.r, g.loss_good_pct, g.loss_bad_pct),
        codel=(q.packets, q.target_ms, q.interval_ms) if q.kind == "codel" else None,
        offset_ms=side.trace_offset_s * 1000.0,
        queue=q,
        delay_first=side.delay_first,
    )


def _queue_field(link: LinkSpec, direction: str) -> str:
    own = getattr(link, f"{direction}_queue")
    return f"{direction}_queue" if own is not None else "queue"


def unsupported(profile: NetworkProfile) -> str | None:
    """Why netem cannot run PROFILE exactly as defined (one line), or None."""
    for selector, link in [("", profile.link), *profile.hosts]:
        if link is None:
            continue
        where = f"network {profile.name}" + (f", host {selector}" if selector else "")
        for side in link.sides:
            if side.delay_trace is not None:
                return (f"{where}: delay_trace: the netem backend cannot vary the delay "
                        "over time; use backend userspace")
            if side.queue.kind != "droptail" and side.queue.bytes is not None:
                return (f"{where}: {_queue_field(link, side.direction)}.bytes: Linux's "
                        f"{LEAF_QDISC[side.queue.kind]} bounds packets only; drop the byte "
                        "bound or use backend userspace")
    return None


LEAF_QDISC = {"drophead": "pfifo_head_drop", "codel": "codel", "pie": "pie",
              "fq_codel": "fq_codel"}
"""Queue kind -> the kernel qdisc that holds such a queue under tbf."""


def qdiscs_needed(profile: NetworkProfile) -> list[str]:
    """The leaf qdiscs PROFILE needs (each probed before a run: the kernel may lack it)."""
    kinds = {q.kind for link in profile.links() for q in link.queues()}
    return [LEAF_QDISC[k] for k in LEAF_QDISC if k in kinds]
