"""The userspace emulator process (the child side of the userspace link backend).

``python -m testbed.links.emulator --control-fd N`` serves one group of hosts (one
topology) on an inherited control socket, with every host's TUN fd inherited too.
``python -m testbed.links.emulator --service-fd N`` is the shared emulator of a
process's lanes: on the service socket (SOCK_SEQPACKET) the parent sends, one message
per group, a new control socket and the group's TUN fds (SCM_RIGHTS), and the child
serves every group at once, each on its own control connection with its own link core
and statistics (``testbed.links.emulator_group`` has the per-group control ops).

It runs the groups' ``EmulatorCore`` in one plain epoll loop (:class:`_Watch`): the fds
stay registered between waits, so a wait costs the same for 10 hosts or 10,000 and the
number of hosts is bounded by memory and the process's fd limit, not by select()'s
1,024 descriptors (:func:`fd_limit`). epoll's own timeout has millisecond resolution,
so the next release is a CLOCK_MONOTONIC timerfd in the same epoll set with the timer
slack set to 1 ns: releases are ~0.1 ms late at worst, where a bare epoll timeout (trio's)
would be ~1 ms late. It is a process, not a
thread of the controller, so the controller's GIL (5 ms switch interval) never delays a
packet; and one process for every lane means one real-time loop instead of one per lane
competing for two cores (docs/emulator.md).

A frozen emulator (SIGSTOP, a host that does not run it) holds the packets that arrive
meanwhile in the TUN queues, and a packet's delay is counted from when the loop reads
it, so release lateness alone would not see the freeze. The loop therefore wakes at
least every ``WATCH_S``, and a wake later than its timeout by more than ``STALL_MIN_MS``
is a stall: every group whose packets are read within ``STALL_READ_MS`` of it (they
waited through it) gets it as lateness (``late_max_us``), which the episode's
disturbance verdict reads.

EOF on a group's control socket ends that group (its fds are closed); EOF on the
inherited control socket, or on the service socket, means the controller is gone and
stops the child, as do SIGTERM and SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import math
import os
import resource
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
_CLOCK_MONOTONIC = 1  # time.monotonic()'s clock on Linux
_TFD_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1
#: fds the emulator holds besides one per host: stdio, the control or service socket,
#: the epoll and timer fds, a group's control sockets, open link logs' slack
FIXED_FDS = 64
_READ_BATCH = 64
_SPIN_MS = 0.3
MAX_GROUP_FDS = 253  # SCM_RIGHTS carries at most 253 fds: a control socket + 252 hosts
WATCH_S = 0.05  # the loop wakes at least this often, so a freeze shows as a late wake
STALL_MIN_MS = 2.0  # a wake later than this past its timeout is a stall
STALL_READ_MS = 20.0  # packets read this soon after a stall waited through it


def _set_timer_slack_ns(ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    # No PR_SET_PDEATHSIG here: trio spawns children from a worker thread, and the
    # death signal fires when that *thread* exits (trio retires idle threads after a
    # few seconds), which killed the emulator mid-campaign. The control socket's EOF
    # is the reliable sign that the controller is gone (see run_child).


class _Stop(Exception):
    pass


def fd_limit(wanted: int | None = None) -> int:
    """How many fds this process may open (RLIMIT_NOFILE), its soft limit raised to
    WANTED if it is lower (None: to the hard limit) as far as the hard limit allows.
    The emulator needs one per host beside :data:`FIXED_FDS`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if wanted is None else wanted
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class _Timer:
    """A one-shot CLOCK_MONOTONIC timerfd: wakes the epoll wait at a deadline with the
    kernel's resolution (epoll's own timeout rounds up to whole milliseconds)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._settime = libc.timerfd_settime
        self.fd = int(libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK_CLOEXEC))
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")

    def arm(self, deadline_s: float) -> None:
        """Fire at DEADLINE_S on time.monotonic()'s clock (re-arming clears a firing)."""
        sec = int(deadline_s)
        spec = _Itimerspec(_Timespec(0, 0),
                           _Timespec(sec, max(1, int((deadline_s - sec) * 1e9))))
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)


class _Watch:
    """The fds the loop waits on, registered with one epoll (level-triggered, readable).

    An fd is unregistered before it is closed: epoll keys its entries by the open file,
    which the parent still holds for a TUN fd, so a closed but registered fd would keep
    waking the loop."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.timer = _Timer()
        self.epoll.register(self.timer.fd, select.EPOLLIN)
        self.fds: set[int] = set()

    def update(self, wanted: set[int]) -> None:
        for fd in self.fds - wanted:
            with contextlib.suppress(OSError):
                self.epoll.unregister(fd)
        for fd in wanted - self.fds:
            self.epoll.register(fd, select.EPOLLIN)
        self.fds = wanted

    def wait(self, timeout_s: float | None) -> list[int]:
        """The readable fds, waiting at most TIMEOUT_S (None: until one is)."""
        if timeout_s is None:
            events = self.epoll.poll(-1)
        elif timeout_s <= 0:
            events = self.epoll.poll(0)
        else:
            self.timer.arm(time.monotonic() + timeout_s)
            # the timer wakes the wait; epoll's own (rounded up) timeout is a backstop
            events = self.epoll.poll(math.ceil(timeout_s * 1000.0 + 1.0) / 1000.0)
        ready = []
        for fd, _ in events:
            if fd == self.timer.fd:
                self.timer.clear()
            else:
                ready.append(fd)
        return ready

    def close(self) -> None:
        self.epoll.close()
        self.timer.close()


def _try_realtime(priority: int) -> bool:
    """SCHED_FIFO so that other load on the host cannot delay a release by milliseconds.

    The loop sleeps in epoll between events and polls at most SPIN_MS per event, and
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
    """Write every packet of ST due now; the wait until its next event (seconds)."""
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
    # Sleep until SPIN_MS before the event, then poll: a sleeping wait wakes
    # ~0.05-0.2 ms late; polling the last stretch is exact.
    return max(0.0, nxt - monotonic() * 1000.0 - spin_ms) / 1000.0


def _read_packets(st: GroupState, fd: int, src: int, now_ms: float) -> None:
    """Packets waiting on host SRC's TUN fd FD into the link core."""
    assert st.core is not None
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


def _note_stall(group: GroupState, stall: tuple[float, float] | None, now_ms: float) -> None:
    """Packets read just after a stall (``(stall_ms, until_ms)``) waited in their TUN
    queue through it: they were late by (about) it."""
    if stall is not None and now_ms <= stall[1]:
        stall_us = int(stall[0] * 1000.0)
        if stall_us > group.late_max_us:
            group.late_max_us = stall_us


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
    """The emulator's epoll loop over every group; returns the exit status."""
    _set_timer_slack_ns(1)
    fd_limit()  # as many hosts as the hard fd limit allows
    realtime = _try_realtime(rt_priority)
    conns: dict[int, _Conn] = {}
    if control_fd is not None:
        ctl = socket.socket(fileno=control_fd)
        ctl.setblocking(False)
        conns[ctl.fileno()] = _Conn(ctl, GroupState(realtime=realtime))
    service = None if service_fd is None else socket.socket(fileno=service_fd)
    watch = _Watch()

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop

    def drop(fd: int) -> None:
        conn = conns.pop(fd)
        watch.update(watch.fds - {fd, *conn.group.fds})  # before the fds close
        conn.close()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    owner: dict[int, tuple[_Conn, int]] = {}  # TUN fd -> its group, its host index
    changed = True
    woke_ms = time.monotonic() * 1000.0
    stall: tuple[float, float] | None = None  # the last stall: its length, until when
    try:
        while True:
            if changed:  # a group came, went or was configured, or a host's fd died
                owner = {fd: (c, i) for c in conns.values()
                         for i, fd in enumerate(c.group.fds) if fd not in c.group.dead}
                watch.update({*conns, *owner,
                              *([service.fileno()] if service is not None else [])})
                changed = False
            timeouts = [t for c in conns.values()
                        if (t := _release(c.group, spin_ms)) is not None]
            wait_s = min([*timeouts, WATCH_S])
            readable = watch.wait(wait_s)
            now = time.monotonic() * 1000.0
            stall_ms = now - woke_ms - wait_s * 1000.0
            woke_ms = now
            if stall_ms > STALL_MIN_MS:
                stall = (stall_ms, now + STALL_READ_MS)
            for r in readable:
                if service is not None and r == service.fileno():
                    conn = _accept_group(service, realtime)
                    if conn is None:
                        return 0  # the controller went away
                    conns[conn.sock.fileno()] = conn
                    changed = True
                elif r in conns:
                    changed = True
                    if not _serve(conns[r]):
                        drop(r)
                        if service is None:
                            return 0  # the one group (and its controller) is done
                elif r in owner and owner[r][0].sock.fileno() in conns:
                    group = owner[r][0].group
                    _note_stall(group, stall, now)
                    dead = len(group.dead)
                    _read_packets(group, r, owner[r][1], now)
                    changed = changed or len(group.dead) != dead
    except _Stop:
        return 0
    finally:
        watch.close()
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
