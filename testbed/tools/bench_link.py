"""`testbed bench link`: how faithful and how fast the emulated links are.

Measures request/response exchanges between two agent namespaces over each profile and
puts them beside a prediction from the same link model replayed offline (no kernel, no
TCP congestion window: the prediction is a floor for large replies), and the backend's
forwarding capacity (UDP packets/s it moves with under 1 ms one-way latency).

``backend`` is ``userspace`` (the TUN emulator) or ``netem`` (kernel qdiscs), so the two
can be compared case by case. What only one backend has is None for the other: the
emulator's release lateness and real-time priority (``emulator_*``) for userspace, the
trace replay's rate-change lateness and skipped steps (``replay_*``) for netem.

The request/response probe is ``testbed.tools.echo_probe``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from testbed.host.kernel import socket_in_netns
from testbed.links.linkspec import DEFAULT_ORDER
from testbed.links.model import DirectionSpec, cross_queues, direction_spec
from testbed.links.profiles import NetworkProfile, get_profile
from testbed.net.plan import Host
from testbed.net.topology import Topology, open_topology
from testbed.tools.bench_networks import bench_networks
from testbed.tools.echo_probe import ECHO_PORT, open_echo_server, timed_exchanges

TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12
MSS_BYTES = 1500 - TCP_IP_HEADER_BYTES
SIZES = ((200, 200), (200, 4096), (200, 65536))
TURNAROUND_MS = 0.05
"""Server time from request in to reply out, in the prediction: a reply can never catch
the very opportunity at which its request was delivered (a fixed constant, not fitted)."""


# ---------------------------------------------------------------- offline prediction


def _packets(payload: int) -> list[int]:
    full, rest = divmod(payload, MSS_BYTES)
    sizes = [MSS_BYTES + TCP_IP_HEADER_BYTES] * full
    if rest:
        sizes.append(rest + TCP_IP_HEADER_BYTES)
    return sizes


def predict_exchanges(
    up: DirectionSpec,
    down: DirectionSpec,
    starts_s: Sequence[float],
    request_bytes: int,
    reply_bytes: int,
    *,
    fresh: bool,
) -> list[float]:
    """Replay each exchange (at its measured start time) through the link model, in ms.

    Client uplink + server downlink carry the request, server uplink + client downlink
    the reply; a fresh connection first pays a SYN / SYN-ACK round. No congestion window
    and no delayed ACKs: a floor for what TCP can do over the same link.
    """
    rng = random.Random(0)
    a_up, b_down, b_up, a_down = (
        s.make_queue(rng) for s in (up, down, up, down)
    )
    out: list[float] = []
    for start_s in starts_s:
        t = start_s * 1000.0
        if fresh:
            t = cross_queues([a_up, b_down], [60], t)
            t = cross_queues([b_up, a_down], [60], t)
        t = cross_queues([a_up, b_down], _packets(request_bytes), t)
        t = cross_queues([b_up, a_down], _packets(reply_bytes), t + TURNAROUND_MS)
        out.append(t - start_s * 1000.0)
    return out


# ---------------------------------------------------------------- forwarding capacity


def _udp_blast(
    src: Host, dst: Host, rate_pps: int, duration_s: float, port: int
) -> tuple[int, int, list[float]]:
    """Send RATE_PPS UDP packets for DURATION_S in 1 ms bursts; (sent, received, one-way ms)."""
    rx = socket_in_netns(dst.netns, socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket_in_netns(src.netns, socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind((dst.address, port))
    rx.settimeout(0.5)
    latencies: list[float] = []
    received = 0

    def receive() -> None:
        nonlocal received
        while True:
            try:
                data = rx.recv(2048)
            except TimeoutError:
                return
            if data == b"end":
                return
            now = time.monotonic_ns()
            received += 1
            latencies.append((now - int.from_bytes(data[:8], "big")) / 1e6)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sent = 0
    per_ms = max(1, rate_pps // 1000)
    pad = bytes(92)
    start = time.monotonic()
    tick = start
    target = (dst.address, port)
    while tick - start < duration_s:
        for _ in range(per_ms):
            tx.sendto(time.monotonic_ns().to_bytes(8, "big") + pad, target)
            sent += 1
        tick += 0.001
        pause = tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # sleeping (not spinning) leaves the GIL to the receiver
    time.sleep(0.1)
    tx.sendto(b"end", target)
    # no timeout: the receiver ends at "end" or, if the link lost it, after 0.5 s of
    # silence; rx closes only then (closed under a receiver still reading a backlog, its
    # number would go to the next descriptor opened, and the receiver would read that)
    thread.join()
    tx.close()
    rx.close()
    return sent, received, latencies


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def measure_capacity(
    topo: Topology,
    rates_pps: Sequence[int] = (10_000, 20_000, 40_000, 60_000, 80_000, 100_000),
    *,
    duration_s: float = 0.5,
    trials: int = 2,
) -> tuple[int, list[dict[str, float | None]]]:
    """Highest offered rate delivered >= 99% with p99 one-way latency < 1 ms.

    Each rate gets up to TRIALS tries (a shared host's other load can spoil one);
    every try is reported. The sweep stops at the first rate that fails them all.
    """
    a, b = topo.hosts["a"], topo.hosts["b"]
    best = 0
    rows: list[dict[str, float | None]] = []
    port = ECHO_PORT + 100
    for rate in rates_pps:
        passed = False
        for trial in range(trials):
            port += 1
            await topo.clear_link_statistics()
            sent, received, lat = await trio.to_thread.run_sync(
                _udp_blast, a, b, rate, duration_s, port
            )
            stats = await topo.link_statistics()
            row: dict[str, float | None] = {
                "offered_pps": float(rate),
                "trial": float(trial),
                "sent": float(sent),
                "received": float(received),
                "p50_ms": round(_percentile(lat, 0.5), 4),
                "p99_ms": round(_percentile(lat, 0.99), 4),
                **link_health(topo.backend, stats),
            }
            rows.append(row)
            if received >= 0.99 * sent and _percentile(lat, 0.99) < 1.0:
                best = max(best, int(sent / duration_s))
                passed = True
                break
        if not passed:
            break
    return best, rows


def link_health(backend: str, stats: dict[str, float]) -> dict[str, float | None]:
    """The backend's own figures for a case; None where they do not apply (module doc)."""
    emulator = backend == "userspace"
    replay = backend == "netem"
    return {
        "emulator_late_p99_ms": stats["late_p99_ms"] if emulator else None,
        "emulator_realtime": stats["realtime"] if emulator else None,
        "replay_late_p99_ms": stats["late_p99_ms"] if replay else None,
        "replay_late_max_ms": stats["late_max_ms"] if replay else None,
        "replay_steps_skipped": stats["steps_skipped"] if replay else None,
    }


def _cpu_model() -> str:
    """The CPU's model name (a TCG guest says "QEMU Virtual CPU ...")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------- the benchmark


@dataclass(frozen=True)
class BenchProfile:
    key: str
    profile: NetworkProfile


def bench_profiles(order: str | None = None) -> list[BenchProfile]:
    """The benchmark's networks; ORDER (``linkspec.ORDERS``) sets every link's order,
    so a matched comparison with Mahimahi (``order = "mahimahi"``) runs either way."""
    profiles = [
        BenchProfile("fixed20", get_profile("fixed", delay_ms=20.0)),
        BenchProfile("fixed20_12mbit", get_profile("fixed", delay_ms=20.0, rate_kbit=12000.0)),
        *(BenchProfile(name, get_profile(name)) for name in ("att", "att2016", "tmobile", "verizon")),
    ]
    if order is None:
        return profiles
    return [BenchProfile(bp.key, with_order(bp.profile, order)) for bp in profiles]


def with_order(profile: NetworkProfile, order: str) -> NetworkProfile:
    """PROFILE with every link's ``order`` set to ORDER."""
    if profile.link is None:
        return profile
    return replace(profile, link=profile.link.with_overrides(order=order),
                   hosts=tuple((sel, lk.with_overrides(order=order))
                               for sel, lk in profile.hosts))


def _summary(measured: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(measured)),
        "p50_ms": round(statistics.median(measured), 3),
        "p99_ms": round(_percentile(measured, 0.99), 3),
        "predicted_p50_ms": round(statistics.median(predicted), 3),
        "predicted_p99_ms": round(_percentile(predicted, 0.99), 3),
    }


@contextlib.contextmanager
def _probe_priority(priority: int = 5, *, enabled: bool = True) -> Iterator[bool]:
    """Run the probe (client and server) at SCHED_FIFO below the emulator's priority.

    On a shared host other processes otherwise delay the probe's own wake-ups by
    milliseconds, which would be charged to the link. Restored on exit. Not for netem
    (ENABLED false): there the kernel shapes in softirq context and the trace replay
    runs in this very process, and a real-time probe competes with both (under an
    emulated CPU it starved them: seconds of extra delay).
    """
    if not enabled:
        yield False
        return
    try:
        previous = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, previous[0], previous[1])


async def bench_link(
    json_path: Path | None, console: Any, *, backend: str = "userspace", count: int = 10,
    max_case_s: float = 8.0, order: str | None = None,
) -> dict[str, Any]:
    """Run every case on BACKEND (every link in ORDER if given); print a line per case;
    write JSON to JSON_PATH if given (~2 min)."""
    with _probe_priority(enabled=backend == "userspace") as realtime_probe:
        result = await _bench(console, backend=backend, count=count, max_case_s=max_case_s,
                              order=order)
    result["machine"]["realtime_probe"] = realtime_probe
    result["order"] = order or DEFAULT_ORDER
    result["command"] = (f".venv/bin/testbed bench link --backend {backend}"
                         f"{f' --order {order}' if order else ''} --json FILE (as root)")
    if json_path is not None:
        await trio.Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


async def _bench(console: Any, *, backend: str, count: int, max_case_s: float,
                 order: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any] = {
        "backend": backend,
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
        },
        "cases": {},
    }
    for bp in bench_profiles(order):
        async with open_topology(bp.profile, ["a", "b"], backend=backend) as topo:
            a, b = topo.hosts["a"], topo.hosts["b"]
            up = direction_spec(bp.profile.link, "up")
            down = direction_spec(bp.profile.link, "down")
            async with open_echo_server(b):
                for req, rep in SIZES:
                    for fresh in (False, True):
                        n = 40 if (bp.key == "fixed20" and rep == 200 and not fresh) else count
                        await topo.clear_link_statistics()
                        origin_s = await topo.restart_trace()
                        starts, ms = await timed_exchanges(
                            a, b, req, rep, count=n, fresh=fresh, max_s=max_case_s,
                            origin_s=origin_s,
                        )
                        pred = predict_exchanges(up, down, starts, req, rep, fresh=fresh)
                        name = f"{bp.key}_{req}_{rep}_{'fresh' if fresh else 'persistent'}"
                        row: dict[str, float | None] = {**_summary(ms, pred)}
                        row.update(link_health(topo.backend, await topo.link_statistics()))
                        result["cases"][name] = row
                        console.print(
                            f"{name:40s} p50 {row['p50_ms']:9.2f}  p99 {row['p99_ms']:9.2f}  "
                            f"predicted p50 {row['predicted_p50_ms']:9.2f}"
                        )
    base = result["cases"]["fixed20_200_200_persistent"]
    result["fixed20_rtt_p50_ms"] = base["p50_ms"]
    result["fixed20_rtt_p99_ms"] = base["p99_ms"]
    zero = get_profile("fixed", delay_ms=0.0)
    async with open_topology(zero, ["a", "b"], backend=backend) as topo:
        pps, rows = await measure_capacity(topo)
    result["forwarding_pps"] = pps
    result["emulator_pps"] = pps if backend == "userspace" else None
    result["capacity_sweep"] = rows
    result["networks"] = await bench_networks(console, measure_capacity=measure_capacity)
    result["emulator_pps_logging"] = result["networks"]["emulator_pps_logging"]
    result["wall_s"] = round(time.monotonic() - started, 1)
    console.print(
        f"{backend}: fixed20 rtt p50 {result['fixed20_rtt_p50_ms']:.2f} ms, "
        f"p99 {result['fixed20_rtt_p99_ms']:.2f} ms; forwarding {pps} packets/s; "
        f"{result['wall_s']} s"
    )
    return result
