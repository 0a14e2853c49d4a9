"""The emulator's loop is not bounded by select()'s 1,024 descriptors (testbed.links.emulator).

The real emulator process serves more hosts than select() could watch; each host's TUN
fd is one end of a datagram socket pair (the emulator reads and writes whole IPv4
packets on it as on a TUN device), so no root and no namespace is needed. A packet
crosses from the first host to the last and back, through their links' delays."""

from __future__ import annotations

import os
import socket
import time

import trio

from testbed.links.emulator import FIXED_FDS, fd_limit
from testbed.links.model import direction_spec
from testbed.links.profiles import get_profile
from testbed.links.userspace import EmulatedHost, open_emulator

HOSTS = 1100  # the emulator's fds run past 1,024, where select() raises ValueError
DELAY_MS = 5.0


def _address(i: int) -> str:
    return f"198.18.{i // 250}.{i % 250 + 1}"


def _packet(src: int, dst: int, payload: bytes) -> bytes:
    """An IPv4 header (the emulator routes on its destination) and PAYLOAD."""
    header = bytes([0x45, 0, 0, 20 + len(payload), 0, 0, 0, 0, 64, 17, 0, 0])
    return header + socket.inet_aton(_address(src)) + socket.inet_aton(_address(dst)) + payload


async def _crossing(outer: list[socket.socket], src: int, dst: int) -> float:
    """Seconds a packet takes from host SRC to host DST (it arrives unchanged)."""
    packet = _packet(src, dst, f"{src}->{dst}".encode())
    start = time.monotonic()
    outer[src].send(packet)
    with trio.fail_after(10):
        await trio.lowlevel.wait_readable(outer[dst])
    elapsed = time.monotonic() - start
    assert outer[dst].recv(65536) == packet
    return elapsed


async def test_the_emulator_serves_more_hosts_than_select_could_watch() -> None:
    assert fd_limit() >= HOSTS * 2 + FIXED_FDS, "this test needs more fds than the limit"
    link = get_profile("fixed", delay_ms=DELAY_MS).link
    up, down = direction_spec(link, "up"), direction_spec(link, "down")
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(HOSTS)]
    try:
        for inner, other in pairs:
            inner.setblocking(False)  # as a TUN fd: the emulator reads until EAGAIN
            other.setblocking(False)
        hosts = [EmulatedHost(f"h{i}", _address(i), inner.fileno(), up, down)
                 for i, (inner, _) in enumerate(pairs)]
        outer = [o for _, o in pairs]
        async with open_emulator(hosts, seed=1) as handle:
            pid = handle.process.pid
            assert len(os.listdir(f"/proc/{pid}/fd")) > 1024
            assert max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd")) > 1024
            for src, dst in ((0, HOSTS - 1), (HOSTS - 1, 0), (HOSTS // 2, 1)):
                elapsed = await _crossing(outer, src, dst)
                # the source's uplink and the destination's downlink: 2 x DELAY_MS
                assert 2 * DELAY_MS / 1000 * 0.9 <= elapsed < 2.0
            counters = await handle.counters()
            assert handle.process.returncode is None
        assert counters
    finally:
        for inner, outer_sock in pairs:
            inner.close()
            outer_sock.close()
