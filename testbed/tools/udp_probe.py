"""A numbered UDP stream between two hosts of a topology, and what it says about the link.

``udp_stream`` sends COUNT datagrams (8-byte sequence number + 8-byte send time, padded
to the size asked for) in bursts of PER_BURST every INTERVAL_S from one namespace and
records, in another, which arrived when: the kernel's receive timestamp
(``SO_TIMESTAMPNS``, taken when the packet reached the socket, so a receiver thread
that a loaded host wakes late does not bunch the times), on ``time.monotonic``'s
clock.

The receiving socket's own overflows are counted apart from the link's losses: the
kernel numbers every datagram the socket dropped because its buffer was full
(``SO_RXQ_OVFL`` on each arrival, ``SO_MEMINFO`` at the end). A receiver that the host
or an emulated CPU stalls (measured in the VM lane's guest: 696 of 20,000 dropped in
one 140 ms stall) would otherwise read as link loss. The buffer is forced large where
the caller may (root), and the collector is paused while the stream runs.

With ``warm_up``, before the numbered stream, unnumbered warm-up datagrams go out every
20 ms until one arrives (for loss and rate measurements; a warm-up would sit in a
queue that a test means the stream to meet empty). On the kernel backend the hosts
share an Ethernet bridge, so the first datagram waits for ARP. When the request or the
reply is lost on a lossy link, the kernel retries after a second and drops what it
queued meanwhile (about 5,000 datagrams of a 5,000/s stream, measured in the VM lane as
28% "loss" on a 4.8% link). The warm-up keeps address resolution out of what the
stream measures. It is
the probe of the fidelity tests (tests/testbed/net/test_link_fidelity.py) and of the
loss, trace and CoDel cases of ``testbed bench link``. Runs blocking: call it through
``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import gc
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.host.kernel import socket_in_netns
from testbed.net.plan import Host

_TIMESPEC = struct.Struct("@qq")
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
_SO_RXQ_OVFL = 40  # Linux: the socket's drop count on each received datagram
_SO_MEMINFO = 55  # Linux: u32[SK_MEMINFO_VARS]; index 8 is the drop count
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_MEMINFO_DROPS = 8
_U32 = struct.Struct("@I")
RECEIVE_BUFFER_BYTES = 64 << 20

IP_UDP_HEADER_BYTES = 28
_STAMP = struct.Struct("!QQ")
WARMUP_SEQ = (1 << 64) - 1  # a warm-up datagram's sequence number, never a stream's
WARMUP_EVERY_S = 0.02


def loss_runs(lost: Sequence[bool]) -> list[int]:
    """Lengths of the runs of consecutive True flags (lost packets, in order)."""
    runs: list[int] = []
    current = 0
    for flag in lost:
        if flag:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs + ([current] if current else [])


@dataclass(frozen=True)
class StreamResult:
    sent: int
    arrivals: list[tuple[int, float]]  # (sequence number, receive time), in arrival order
    send_times: list[float]  # by sequence number
    receiver_drops: int = 0
    """Datagrams the receiving socket dropped (buffer full): the probe's, not the link's."""
    receiver_gaps: tuple[tuple[int, int], ...] = ()
    """Sequence ranges [first, end) of missing datagrams among which the receiver dropped
    some (between two arrivals whose drop counts differ, or after the last arrival)."""
    warmups_sent: int = 0
    warmups_received: int = 0
    """Warm-up datagrams sent and received: the ones lost crossed (or died at) the link
    before the stream, so a link's drop counter read around the call includes them."""

    @property
    def received(self) -> set[int]:
        return {seq for seq, _ in self.arrivals}

    def lost(self) -> list[bool]:
        """Per sequence number: did it not arrive (on the link or at the receiver)."""
        got = self.received
        return [seq not in got for seq in range(self.sent)]

    @property
    def link_lost(self) -> int:
        """Datagrams the link lost: the missing ones less the receiver's own drops."""
        return self.sent - len(self.received) - self.receiver_drops

    def loss_runs(self) -> list[int]:
        """Lengths of the runs of consecutive lost sequence numbers, leaving out the
        receiver's gaps (each is a whole run of missing datagrams, not the link's)."""
        lost = self.lost()
        runs: list[int] = []
        start = 0
        for first, end in sorted(self.receiver_gaps):
            runs += loss_runs(lost[start:first])
            start = max(start, end)
        return runs + loss_runs(lost[start:])

    def rate_kbit(self, ip_bytes: int, *, skip: int = 0) -> float:
        """Delivered rate (IP bytes) between the SKIP-th arrival and the last one."""
        times = [t for _, t in self.arrivals][skip:]
        if len(times) < 2 or times[-1] <= times[0]:
            return 0.0
        return (len(times) - 1) * ip_bytes * 8 / (times[-1] - times[0]) / 1000.0

    def one_way_ms(self) -> list[float]:
        return [(t - self.send_times[seq]) * 1000.0 for seq, t in self.arrivals]


def udp_stream(src: Host, dst: Host, *, count: int, per_burst: int = 1,
               interval_s: float = 0.001, ip_bytes: int = 128, port: int = 9400,
               settle_s: float = 0.5, wait_s: float = 10.0,
               receive_buffer_bytes: int = RECEIVE_BUFFER_BYTES,
               warm_up: bool = False) -> StreamResult:
    """Send the stream (module docstring); after the last send, receive until nothing
    arrived for SETTLE_S (counted from the last send or arrival), at most WAIT_S."""
    payload = max(_STAMP.size, ip_bytes - IP_UDP_HEADER_BYTES)
    pad = bytes(payload - _STAMP.size)
    rx = socket_in_netns(dst.netns, socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket_in_netns(src.netns, socket.AF_INET, socket.SOCK_DGRAM)
    arrivals: list[tuple[int, float]] = []
    drops_at: list[int] = []  # the socket's drop count when each arrival was queued
    send_times = [0.0] * count
    done = threading.Event()
    stop = threading.Event()  # the receiver outlived its time: it must end before rx closes
    warmed = threading.Event()  # a warm-up datagram arrived: the path is resolved
    warmups = [0, 0]  # warm-up datagrams sent, received
    collecting = gc.isenabled()
    try:
        try:
            rx.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, receive_buffer_bytes)
        except PermissionError:  # not root: as much as net.core.rmem_max allows
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        rx.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        rx.setsockopt(socket.SOL_SOCKET, _SO_RXQ_OVFL, 1)
        rx.bind((dst.address, port))
        realtime_minus_monotonic = time.time() - time.monotonic()
        cmsg_space = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_U32.size)
        gc.disable()  # a collection in the receiver thread is a stall the socket pays for
        rx.settimeout(0.05)
        finished: list[float] = []  # the time of the last send, once sent

        def receive() -> None:
            last = 0.0
            while len(arrivals) < count and not stop.is_set():
                try:
                    data, ancillary, _, _ = rx.recvmsg(65536, cmsg_space)
                except TimeoutError:
                    now = time.monotonic()
                    if done.is_set() and (now - max(last, finished[0]) > settle_s
                                          or now - finished[0] > wait_s):
                        return
                    continue
                last = time.monotonic()
                stamp = last
                dropped = 0  # the kernel adds the count only once it is nonzero
                for level, kind, raw in ancillary:
                    if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                        sec, nsec = _TIMESPEC.unpack_from(raw)
                        stamp = sec + nsec / 1e9 - realtime_minus_monotonic
                    elif level == socket.SOL_SOCKET and kind == _SO_RXQ_OVFL:
                        (dropped,) = _U32.unpack_from(raw)
                seq, _ = _STAMP.unpack_from(data)
                if seq == WARMUP_SEQ:
                    warmups[1] += 1
                    warmed.set()
                    continue
                arrivals.append((seq, stamp))
                drops_at.append(dropped)

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        target = (dst.address, port)
        warmup_datagram = _STAMP.pack(WARMUP_SEQ, 0) + pad
        give_up = time.monotonic() + wait_s
        while warm_up and not warmed.is_set() and time.monotonic() < give_up:
            tx.sendto(warmup_datagram, target)
            warmups[0] += 1
            warmed.wait(WARMUP_EVERY_S)
        start = time.monotonic()
        seq = 0
        burst = 0
        while seq < count:
            for _ in range(min(per_burst, count - seq)):
                now = time.monotonic()
                send_times[seq] = now
                tx.sendto(_STAMP.pack(seq, int(now * 1e9)) + pad, target)
                seq += 1
            burst += 1
            pause = start + burst * interval_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        finished.append(time.monotonic())
        done.set()
        thread.join(wait_s + settle_s + 1.0)
        if thread.is_alive():  # a starved receiver (a slow guest): end it, then close rx
            stop.set()
            thread.join()
        receiver_drops = _socket_drops(rx, drops_at)
    finally:
        if collecting:
            gc.enable()
        tx.close()
        rx.close()
    return StreamResult(count, list(arrivals), send_times, receiver_drops,
                        _receiver_gaps(arrivals, drops_at, receiver_drops, count),
                        warmups[0], warmups[1])


def _socket_drops(rx: socket.socket, drops_at: list[int]) -> int:
    """The socket's total drop count (``SO_MEMINFO``; the last arrival's where absent)."""
    try:
        raw = rx.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 4 * (_MEMINFO_DROPS + 1))
    except OSError:
        return drops_at[-1] if drops_at else 0
    return int(_U32.unpack_from(raw, 4 * _MEMINFO_DROPS)[0])


def _receiver_gaps(arrivals: list[tuple[int, float]], drops_at: list[int], total: int,
                   count: int) -> tuple[tuple[int, int], ...]:
    """The missing sequence ranges that hold the receiver's drops (``StreamResult``)."""
    gaps: list[tuple[int, int]] = []
    previous_seq, previous_drops = -1, 0
    for (seq, _), dropped in zip(arrivals, drops_at, strict=True):
        if dropped != previous_drops:
            gaps.append((previous_seq + 1, max(previous_seq + 1, seq)))
        previous_seq, previous_drops = seq, dropped
    if total != previous_drops:
        gaps.append((previous_seq + 1, count))
    return tuple(gaps)
