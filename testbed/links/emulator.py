"""The userspace emulator process (the child side of the userspace link backend).

``python -m testbed.links.emulator --control-fd N`` serves one group of hosts (one
topology) on an inherited control socket, with every host's TUN fd inherited too.
``python -m testbed.links.emulator --service-fd N`` is the shared emulator of a
process's lanes: on the service socket (SOCK_SEQPACKET) the parent sends, one message
per group, a new control socket and the group's TUN fds (SCM_RIGHTS), and the child
serves every group at once, each on its own control connection with its own link core
and statistics (``testbed.links.emulator_group`` has the per-group control ops).

It runs the groups' ``EmulatorCore`` in one plain select() loop: select's timeout has
microsecond resolution and the timer slack is set to 1 ns, so releases are ~0.1 ms late
at worst, where an epoll loop (trio's) would be ~1 ms late. It is a process, not a
thread of the controller, so the controller's GIL (5 ms switch interval) never delays a
packet; and one process for every lane means one real-time loop instead of one per lane
competing for two cores (docs/emulator.md).

EOF on a group's control socket ends that group (its fds are closed); EOF on the
inherited control socket, or on the service socket, means the controller is gone and
stops the child, as do SIGTERM and SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from protocols import wire
from protocols.errors import RemoteProtocolError
from testbed.links.emulator_group import (
    LATE_BIN_US,
    GroupState,
    decode_message,
    encode_message,
    handle,
    log_stop,
    new_decoder,
)

_PR_SET_TIMERSLACK = 29
_READ_BATCH = 64
_SPIN_MS = 0.3
MAX_GROUP_FDS = 253  # SCM_RIGHTS carries at most 253 fds: a control socket + 252 hosts


def _set_timer_slack_ns(ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    # No PR_SET_PDEATHSIG here: trio spawns children from a worker thread, and the
    # death signal fires when that *thread* exits (trio retires idle threads after a
    # few seconds), which killed the emulator mid-campaign. The control socket's EOF
    # is the reliable sign that the controller is gone (see run_child).


class _Stop(Exception):
    pass


def _try_realtime(priority: int) -> bool:
    """SCHED_FIFO so that other load on the host cannot delay a release by milliseconds.

    The loop sleeps in select() between events and polls at most SPIN_MS per event, and
    the kernel's RT throttling (sched_rt_runtime_us) bounds it anyway.
    """
    if priority <= 0:
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError:
        return False
    return True


@dataclass
class _Conn:
    """One group's control connection and the fds the group owns."""

    sock: socket.socket
    group: GroupState
    decoder: wire.FrameDecoder = field(default_factory=new_decoder)
    owned: list[int] = field(default_factory=list)  # received fds, closed with the group

    def close(self) -> None:
        log_stop(self.group)
        self.sock.close()
        for fd in self.owned:
            with contextlib.suppress(OSError):
                os.close(fd)


def _release(st: GroupState, spin_ms: float) -> float | None:
    """Write every packet of ST due now; the select() timeout until its next event."""
    core = st.core
    if core is None:
        return None
    monotonic = time.monotonic
    for exit_ms, dst, packet in core.advance(monotonic() * 1000.0):
        try:
            os.write(st.fds[dst], packet)
        except OSError:
            st.write_errors += 1  # full TUN queue or namespace gone: packet lost
        late_us = int((monotonic() * 1000.0 - exit_ms) * 1000.0)
        st.lateness[min(late_us // LATE_BIN_US, len(st.lateness) - 1)] += 1
        if late_us > st.late_max_us:
            st.late_max_us = late_us
    nxt = core.next_event_ms()
    if nxt is None:
        return None
    # Sleep until SPIN_MS before the event, then poll: a sleeping select() wakes
    # ~0.05-0.2 ms late; polling the last stretch is exact.
    return max(0.0, nxt - monotonic() * 1000.0 - spin_ms) / 1000.0


def _read_packets(st: GroupState, fd: int, now_ms: float) -> None:
    assert st.core is not None
    src = st.fds.index(fd)
    for _ in range(_READ_BATCH):
        try:
            packet = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in (errno.EBADFD, errno.EIO):
                st.dead.add(fd)  # its namespace is gone: stop watching it
                return
            raise
        st.core.receive(src, packet, now_ms)


def _accept_group(service: socket.socket, realtime: bool) -> _Conn | None:
    """A group the parent sent on the service socket; None at EOF (the parent is gone)."""
    data, fds, _, _ = socket.recv_fds(service, 1 << 16, MAX_GROUP_FDS)
    if not data and not fds:
        return None
    parent_fds = [int(x) for x in msgpack.unpackb(data)["fds"]]
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(False)
    group = GroupState(realtime=realtime, fd_map=dict(zip(parent_fds, fds[1:], strict=True)))
    return _Conn(sock, group, owned=list(fds[1:]))


def _serve(conn: _Conn) -> bool:
    """Handle what arrived on a group's control socket; False when the group ends."""
    try:
        chunk = conn.sock.recv(1 << 20)
    except BlockingIOError:
        return True
    if not chunk:
        return False
    try:
        for body in conn.decoder.feed(chunk):
            reply = handle(conn.group, decode_message(body))
            conn.sock.setblocking(True)
            conn.sock.sendall(encode_message({"ok": True} if reply is None else reply))
            conn.sock.setblocking(False)
            if reply is None:
                return False
    except RemoteProtocolError as exc:
        print(f"emulator: bad control message: {exc}", file=sys.stderr)
        return False
    return True


def run_child(control_fd: int | None = None, *, service_fd: int | None = None,
              spin_ms: float = _SPIN_MS, rt_priority: int = 10) -> int:
    """The emulator's select loop over every group; returns the exit status."""
    _set_timer_slack_ns(1)
    realtime = _try_realtime(rt_priority)
    conns: dict[int, _Conn] = {}
    if control_fd is not None:
        ctl = socket.socket(fileno=control_fd)
        ctl.setblocking(False)
        conns[ctl.fileno()] = _Conn(ctl, GroupState(realtime=realtime))
    service = None if service_fd is None else socket.socket(fileno=service_fd)

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while True:
            timeouts = [t for c in conns.values()
                        if (t := _release(c.group, spin_ms)) is not None]
            owner = {fd: c for c in conns.values() for fd in c.group.fds
                     if fd not in c.group.dead}
            watch = [*conns, *owner, *([service.fileno()] if service is not None else [])]
            readable, _, _ = select.select(watch, [], [], min(timeouts, default=None))
            now = time.monotonic() * 1000.0
            for r in readable:
                if service is not None and r == service.fileno():
                    conn = _accept_group(service, realtime)
                    if conn is None:
                        return 0  # the controller went away
                    conns[conn.sock.fileno()] = conn
                elif r in conns:
                    if not _serve(conns[r]):
                        conns.pop(r).close()
                        if service is None:
                            return 0  # the one group (and its controller) is done
                elif r in owner and owner[r].sock.fileno() in conns:
                    _read_packets(owner[r].group, r, now)
    except _Stop:
        return 0
    finally:
        for conn in conns.values():
            conn.close()
        if service is not None:
            service.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.links.emulator")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--control-fd", type=int, help="serve one group on this socket")
    which.add_argument("--service-fd", type=int, help="accept groups on this socket")
    parser.add_argument("--spin-ms", type=float, default=_SPIN_MS)
    parser.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO; 0 = off")
    args = parser.parse_args(argv)
    return run_child(args.control_fd, service_fd=args.service_fd, spin_ms=args.spin_ms,
                     rt_priority=args.rt_priority)


if __name__ == "__main__":
    raise SystemExit(main())
