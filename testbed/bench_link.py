"""`testbed bench link`: how faithful and how fast the emulated links are.

Measures request/response exchanges between two agent namespaces over each profile and
puts them beside a prediction from the same link model replayed offline (no kernel, no
TCP congestion window: the prediction is a floor for large replies), and the emulator's
forwarding capacity (UDP packets/s it moves with under 1 ms one-way latency).

The probe sockets are created inside the namespaces (a socket keeps the namespace it was
born in) and driven by trio in this process; readiness wake-ups are immediate, only trio
timers are coarse, and no timer is used while timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import socket
import statistics
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from testbed import netns
from testbed.links.profiles import NetworkProfile, get_profile
from testbed.links.userspace import DirectionSpec, LinkQueue, direction_spec
from testbed.topology import Host, Topology, open_topology

ECHO_PORT = 9100
HEADER = struct.Struct(">II")  # request length, reply length
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12
MSS_BYTES = 1500 - TCP_IP_HEADER_BYTES
SIZES = ((200, 200), (200, 4096), (200, 65536))
TURNAROUND_MS = 0.05
"""Server time from request in to reply out, in the prediction: a reply can never catch
the very opportunity at which its request was delivered (a fixed constant, not fitted)."""


# ---------------------------------------------------------------- echo server / client
#
# The probe uses plain blocking sockets on threads: each wake-up is one syscall return, so
# the probe adds as little as it can to what it measures (a trio loop costs ~0.1 ms more
# per round trip). Ping-pong traffic never has client and server threads runnable at once,
# so they do not fight over the GIL.


def _recv_exactly(sock: socket.socket, n: int) -> None:
    left = n
    while left:
        chunk = sock.recv(min(1 << 20, left))
        if not chunk:
            raise ConnectionError(f"peer closed after {n - left} of {n} bytes")
        left -= len(chunk)


class EchoServer:
    """Request/response server inside a host's namespace: a request's 8-byte header says
    its own length and the length of the reply to send."""

    def __init__(self, host: Host, port: int = ECHO_PORT) -> None:
        self.host = host
        self.port = port
        self._listener = netns.socket_in_netns(host.netns)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host.address, port))
        self._listener.listen(64)
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._spawn(self._accept_loop)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append(conn)
            self._spawn(self._serve, conn)

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        try:
            while True:
                head = conn.recv(HEADER.size, socket.MSG_WAITALL)
                if len(head) < HEADER.size:
                    return
                req_len, reply_len = HEADER.unpack(head)
                _recv_exactly(conn, req_len - HEADER.size)
                conn.sendall(bytes(reply_len))
        except OSError:
            return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)
        for conn in conns:
            conn.close()


@contextlib.asynccontextmanager
async def open_echo_server(host: Host, port: int = ECHO_PORT) -> AsyncIterator[EchoServer]:
    server = await trio.to_thread.run_sync(EchoServer, host, port)
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.close)


def exchange(sock: socket.socket, request_bytes: int, reply_bytes: int) -> None:
    """One request of REQUEST_BYTES and its reply of REPLY_BYTES on a connected socket."""
    if request_bytes < HEADER.size:
        raise ValueError(f"request_bytes: at least {HEADER.size}, got {request_bytes}")
    sock.sendall(HEADER.pack(request_bytes, reply_bytes) + bytes(request_bytes - HEADER.size))
    _recv_exactly(sock, reply_bytes)


def _client(host: Host) -> socket.socket:
    sock = netns.socket_in_netns(host.netns)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _timed_exchanges(
    client: Host, server: Host, request_bytes: int, reply_bytes: int, count: int,
    fresh: bool, port: int, max_s: float | None, origin_s: float | None,
) -> tuple[list[float], list[float]]:
    starts: list[float] = []
    durations: list[float] = []
    t0 = time.monotonic()
    origin = t0 if origin_s is None else origin_s
    persistent: socket.socket | None = None
    try:
        if not fresh:
            persistent = _client(client)
            persistent.connect((server.address, port))
        for _ in range(count):
            if max_s is not None and durations and time.monotonic() - t0 > max_s:
                break
            sock = persistent if persistent is not None else _client(client)
            try:
                start = time.monotonic()
                if persistent is None:
                    sock.connect((server.address, port))
                exchange(sock, request_bytes, reply_bytes)
                durations.append((time.monotonic() - start) * 1000.0)
                starts.append(start - origin)
            finally:
                if persistent is None:
                    sock.close()
    finally:
        if persistent is not None:
            persistent.close()
    return starts, durations


async def timed_exchanges(
    client: Host,
    server: Host,
    request_bytes: int,
    reply_bytes: int,
    *,
    count: int,
    fresh: bool,
    port: int = ECHO_PORT,
    max_s: float | None = None,
    origin_s: float | None = None,
) -> tuple[list[float], list[float]]:
    """COUNT exchanges from CLIENT to the echo server on SERVER; (starts s, durations ms).

    Starts are seconds since ORIGIN_S (a time.monotonic() value; default: the call).
    fresh: connect + exchange + close each time (socket creation is not timed);
    otherwise one connection, opened before timing, carries every exchange. Stops early
    once MAX_S have passed. Runs on a worker thread.
    """
    return await trio.to_thread.run_sync(
        partial(_timed_exchanges, client, server, request_bytes, reply_bytes, count,
                fresh, port, max_s, origin_s)
    )


# ---------------------------------------------------------------- offline prediction


def _packets(payload: int) -> list[int]:
    full, rest = divmod(payload, MSS_BYTES)
    sizes = [MSS_BYTES + TCP_IP_HEADER_BYTES] * full
    if rest:
        sizes.append(rest + TCP_IP_HEADER_BYTES)
    return sizes


def _cross(queues: Sequence[LinkQueue], sizes: Sequence[int], t_ms: float) -> float:
    """Send packets of SIZES at T_MS through QUEUES in series; time the last one exits."""
    items = [(t_ms, i) for i in range(len(sizes))]
    for q in queues:
        for t, i in items:
            q.offer(i, sizes[i], t)
        out: list[tuple[float, Any]] = []
        while len(out) < len(items):
            nxt = q.next_event_ms()
            if nxt is None:
                break  # a packet was dropped: the model cannot say more
            out.extend(q.advance(nxt))
        items = [(t, i) for t, i in out]
    return max(t for t, _ in items) if items else t_ms


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
            t = _cross([a_up, b_down], [60], t)
            t = _cross([b_up, a_down], [60], t)
        t = _cross([a_up, b_down], _packets(request_bytes), t)
        t = _cross([b_up, a_down], _packets(reply_bytes), t + TURNAROUND_MS)
        out.append(t - start_s * 1000.0)
    return out


# ---------------------------------------------------------------- forwarding capacity


def _udp_blast(
    src: Host, dst: Host, rate_pps: int, duration_s: float, port: int
) -> tuple[int, int, list[float]]:
    """Send RATE_PPS UDP packets for DURATION_S in 1 ms bursts; (sent, received, one-way ms)."""
    rx = netns.socket_in_netns(dst.netns, socket.AF_INET, socket.SOCK_DGRAM)
    tx = netns.socket_in_netns(src.netns, socket.AF_INET, socket.SOCK_DGRAM)
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
    thread.join(2.0)
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
) -> tuple[int, list[dict[str, float]]]:
    """Highest offered rate delivered >= 99% with p99 one-way latency < 1 ms.

    Each rate gets up to TRIALS tries (a shared host's other load can spoil one);
    every try is reported. The sweep stops at the first rate that fails them all.
    """
    a, b = topo.hosts["a"], topo.hosts["b"]
    assert topo._emulator is not None
    best = 0
    rows: list[dict[str, float]] = []
    port = ECHO_PORT + 100
    for rate in rates_pps:
        passed = False
        for trial in range(trials):
            port += 1
            await topo._emulator.clear_lateness()
            sent, received, lat = await trio.to_thread.run_sync(
                _udp_blast, a, b, rate, duration_s, port
            )
            stats = await topo._emulator.statistics()
            row = {
                "offered_pps": float(rate),
                "trial": float(trial),
                "sent": float(sent),
                "received": float(received),
                "p50_ms": round(_percentile(lat, 0.5), 4),
                "p99_ms": round(_percentile(lat, 0.99), 4),
                "emulator_late_p99_ms": stats["late_p99_ms"],
            }
            rows.append(row)
            if received >= 0.99 * sent and row["p99_ms"] < 1.0:
                best = max(best, int(sent / duration_s))
                passed = True
                break
        if not passed:
            break
    return best, rows


# ---------------------------------------------------------------- the benchmark


@dataclass(frozen=True)
class BenchProfile:
    key: str
    profile: NetworkProfile


def bench_profiles() -> list[BenchProfile]:
    return [
        BenchProfile("fixed20", get_profile("fixed", delay_ms=20.0)),
        BenchProfile("fixed20_12mbit", get_profile("fixed", delay_ms=20.0, rate_kbit=12000.0)),
        *(BenchProfile(name, get_profile(name)) for name in ("att", "att2016", "tmobile", "verizon")),
    ]


def _summary(measured: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(measured)),
        "p50_ms": round(statistics.median(measured), 3),
        "p99_ms": round(_percentile(measured, 0.99), 3),
        "predicted_p50_ms": round(statistics.median(predicted), 3),
        "predicted_p99_ms": round(_percentile(predicted, 0.99), 3),
    }


@contextlib.contextmanager
def _probe_priority(priority: int = 5) -> Iterator[bool]:
    """Run the probe (client and server) at SCHED_FIFO below the emulator's priority.

    On a shared host other processes otherwise delay the probe's own wake-ups by
    milliseconds, which would be charged to the link. Restored on exit.
    """
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
    json_path: Path | None, console: Any, *, count: int = 10, max_case_s: float = 8.0
) -> dict[str, Any]:
    """Run every case; print a line per case; write JSON to JSON_PATH if given (~2 min)."""
    with _probe_priority() as realtime_probe:
        result = await _bench(console, count=count, max_case_s=max_case_s)
    result["machine"]["realtime_probe"] = realtime_probe
    result["command"] = "sudo .venv/bin/testbed bench link --json FILE"
    if json_path is not None:
        await trio.Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    return result


async def _bench(console: Any, *, count: int, max_case_s: float) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any] = {
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "cases": {},
    }
    for bp in bench_profiles():
        async with open_topology(bp.profile, ["a", "b"], backend="userspace") as topo:
            assert topo._emulator is not None
            a, b = topo.hosts["a"], topo.hosts["b"]
            up = direction_spec(bp.profile.link, "up")
            down = direction_spec(bp.profile.link, "down")
            async with open_echo_server(b):
                for req, rep in SIZES:
                    for fresh in (False, True):
                        n = 40 if (bp.key == "fixed20" and rep == 200 and not fresh) else count
                        await topo._emulator.clear_lateness()
                        origin_s = await topo._emulator.restart_trace()
                        starts, ms = await timed_exchanges(
                            a, b, req, rep, count=n, fresh=fresh, max_s=max_case_s,
                            origin_s=origin_s,
                        )
                        pred = predict_exchanges(up, down, starts, req, rep, fresh=fresh)
                        name = f"{bp.key}_{req}_{rep}_{'fresh' if fresh else 'persistent'}"
                        row = _summary(ms, pred)
                        stats = await topo._emulator.statistics()
                        row["emulator_late_p99_ms"] = stats["late_p99_ms"]
                        row["emulator_realtime"] = stats["realtime"]
                        result["cases"][name] = row
                        console.print(
                            f"{name:40s} p50 {row['p50_ms']:9.2f}  p99 {row['p99_ms']:9.2f}  "
                            f"predicted p50 {row['predicted_p50_ms']:9.2f}"
                        )
    base = result["cases"]["fixed20_200_200_persistent"]
    result["fixed20_rtt_p50_ms"] = base["p50_ms"]
    result["fixed20_rtt_p99_ms"] = base["p99_ms"]
    zero = get_profile("fixed", delay_ms=0.0)
    async with open_topology(zero, ["a", "b"], backend="userspace") as topo:
        pps, rows = await measure_capacity(topo)
    result["emulator_pps"] = pps
    result["capacity_sweep"] = rows
    result["wall_s"] = round(time.monotonic() - started, 1)
    console.print(
        f"fixed20 rtt p50 {result['fixed20_rtt_p50_ms']:.2f} ms, "
        f"p99 {result['fixed20_rtt_p99_ms']:.2f} ms; emulator {pps} packets/s; "
        f"{result['wall_s']} s"
    )
    return result
