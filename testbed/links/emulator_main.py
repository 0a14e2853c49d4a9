"""The userspace emulator process and the controller's handle on it.

The child (``python -m testbed.links.emulator_main --control-fd N``) inherits every
host's TUN fd and one end of a socketpair. It runs `userspace.EmulatorCore` in a plain
select() loop: select's timeout has microsecond resolution and the timer slack is set
to 1 ns, so releases are ~0.1 ms late at worst, where an epoll loop (trio's) would be
~1 ms late. It is a process, not a thread of the controller, so the controller's GIL
(5 ms switch interval) never delays a packet. See docs/emulator.md.

Control protocol on the socketpair: frames of 4-byte big-endian length + msgpack map.
Parent -> child: ``{"op": "configure", "specs": [...], "hosts": [...], "seed": int}``
first (each distinct direction spec once, stamps as packed int64; hosts name the index of
their up and down spec), then
``{"op": "restart"}``, ``{"op": "counters"}``, ``{"op": "stop"}``. Child -> parent:
``{"ok": true, ...}`` or ``{"ok": false, "error": str}``. EOF on the socket (the
controller died) stops the child, as do SIGTERM and SIGINT.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import errno
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import trio

from testbed.links.userspace import DirectionSpec, EmulatorCore, HostLinks, LinkQueue

_PR_SET_TIMERSLACK = 29
_MAX_FRAME = 64 * 1024 * 1024
_READ_BATCH = 64
_LATE_BIN_US = 25
_SPIN_MS = 0.3


class EmulatorError(RuntimeError):
    """The emulator process failed or refused its configuration."""


@dataclass(frozen=True)
class EmulatedHost:
    name: str
    address: str
    tun_fd: int
    up: DirectionSpec
    down: DirectionSpec


# ---------------------------------------------------------------- framing


def _frame(body: dict[str, Any]) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


def _spec_to_wire(spec: DirectionSpec) -> dict[str, Any]:
    # not dataclasses.asdict: it deep-copies the (long) stamp tuple
    d = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "stamps_ms"}
    stamps = spec.stamps_ms
    d["stamps"] = None if stamps is None else array.array("q", stamps).tobytes()
    return d


def _spec_from_wire(d: dict[str, Any]) -> DirectionSpec:
    raw = d.pop("stamps")
    stamps = None if raw is None else tuple(array.array("q", raw))
    return DirectionSpec(stamps_ms=stamps, **d)


# ---------------------------------------------------------------- child


def _set_timer_slack_ns(ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    # No PR_SET_PDEATHSIG here: trio spawns children from a worker thread, and the
    # death signal fires when that *thread* exits (trio retires idle threads after a
    # few seconds), which killed the emulator mid-campaign. The control socket's EOF
    # is the reliable sign that the controller is gone (see run_child).


class _Stop(Exception):
    pass


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _build_core(msg: dict[str, Any]) -> tuple[EmulatorCore, list[int]]:
    seed = int(msg["seed"])
    specs = [_spec_from_wire(dict(d)) for d in msg["specs"]]
    schedules = [spec.schedule() for spec in specs]  # immutable: shared by all hosts
    hosts: list[HostLinks] = []
    fds: list[int] = []
    now = _now_ms()

    def queue(index: int, rng_seed: int) -> LinkQueue:
        spec = specs[index]
        return LinkQueue(
            schedules[index], delay_ms=spec.delay_ms, loss_pct=spec.loss_pct,
            queue_packets=spec.queue_packets, queue_bytes=spec.queue_bytes,
            rng=random.Random(rng_seed), origin_ms=now,
        )

    for i, h in enumerate(msg["hosts"]):
        up = queue(int(h["up"]), seed * 1000 + 2 * i)
        down = queue(int(h["down"]), seed * 1000 + 2 * i + 1)
        hosts.append(HostLinks(h["name"], socket.inet_aton(h["address"]), up, down))
        fds.append(int(h["fd"]))
    return EmulatorCore(hosts), fds


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
class _State:
    """What the child's loop and its control handler share."""

    realtime: bool
    core: EmulatorCore | None = None
    fds: list[int] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    lateness: list[int] = field(default_factory=lambda: [0] * 200)  # _LATE_BIN_US bins
    write_errors: int = 0


def _handle(st: _State, msg: dict[str, Any]) -> dict[str, Any] | None:
    """One control request; the reply, or None for `stop`."""
    op = msg.get("op")
    if op == "configure":
        st.core, st.fds = _build_core(msg)
        return {"ok": True}
    if op == "stop":
        return None
    if st.core is None:
        return {"ok": False, "error": f"op: {op!r} before configure"}
    if op == "restart":
        origin_ms = time.monotonic() * 1000.0
        st.core.restart(origin_ms)
        return {"ok": True, "origin_ms": origin_ms}
    if op == "counters":
        return {
            "ok": True,
            "counters": st.core.counters(),
            "unroutable": st.core.unroutable,
            "write_errors": st.write_errors,
            "lateness_bin_us": _LATE_BIN_US,
            "realtime": st.realtime,
            "lateness": st.lateness,
        }
    if op == "clear_lateness":
        st.lateness = [0] * len(st.lateness)
        return {"ok": True}
    return {"ok": False, "error": f"op: {op!r} is not one of configure, restart, "
            "counters, clear_lateness, stop"}


def _release(st: _State, core: EmulatorCore, spin_ms: float) -> float | None:
    """Write every packet due now; return the select() timeout until the next event."""
    monotonic = time.monotonic
    for exit_ms, dst, packet in core.advance(monotonic() * 1000.0):
        try:
            os.write(st.fds[dst], packet)
        except OSError:
            st.write_errors += 1  # full TUN queue or namespace gone: packet lost
        late_us = int((monotonic() * 1000.0 - exit_ms) * 1000.0)
        st.lateness[min(late_us // _LATE_BIN_US, len(st.lateness) - 1)] += 1
    nxt = core.next_event_ms()
    if nxt is None:
        return None
    # Sleep until SPIN_MS before the event, then poll: a sleeping select() wakes
    # ~0.05-0.2 ms late; polling the last stretch is exact.
    return max(0.0, nxt - monotonic() * 1000.0 - spin_ms) / 1000.0


def _read_packets(st: _State, core: EmulatorCore, fd: int, now_ms: float) -> None:
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
        core.receive(src, packet, now_ms)


def run_child(control_fd: int, *, spin_ms: float = _SPIN_MS, rt_priority: int = 10) -> int:
    """The emulator's select loop; returns the exit status."""
    _set_timer_slack_ns(1)
    st = _State(realtime=_try_realtime(rt_priority))
    ctl = socket.socket(fileno=control_fd)
    ctl.setblocking(False)
    ctl_fd = ctl.fileno()

    def on_signal(signum: int, frame: Any) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    inbuf = bytearray()
    try:
        while True:
            timeout = None if st.core is None else _release(st, st.core, spin_ms)
            watch = [ctl_fd, *(fd for fd in st.fds if fd not in st.dead)]
            readable, _, _ = select.select(watch, [], [], timeout)
            now = time.monotonic() * 1000.0
            for r in readable:
                if r != ctl_fd:
                    assert st.core is not None
                    _read_packets(st, st.core, r, now)
                    continue
                try:
                    chunk = ctl.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    return 0  # the controller went away
                inbuf += chunk
                while len(inbuf) >= 4:
                    (n,) = struct.unpack(">I", inbuf[:4])
                    if n > _MAX_FRAME:
                        return 2
                    if len(inbuf) < 4 + n:
                        break
                    msg = msgpack.unpackb(bytes(inbuf[4 : 4 + n]), raw=False)
                    del inbuf[: 4 + n]
                    reply = _handle(st, msg)
                    ctl.setblocking(True)
                    ctl.sendall(_frame({"ok": True} if reply is None else reply))
                    ctl.setblocking(False)
                    if reply is None:
                        return 0
    except _Stop:
        return 0
    finally:
        ctl.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.links.emulator_main")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--spin-ms", type=float, default=_SPIN_MS)
    parser.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO; 0 = off")
    args = parser.parse_args(argv)
    return run_child(args.control_fd, spin_ms=args.spin_ms, rt_priority=args.rt_priority)


# ---------------------------------------------------------------- parent


class EmulatorHandle:
    """The controller's side: one request at a time over the control socket."""

    def __init__(self, sock: trio.socket.SocketType, process: trio.Process) -> None:
        self._sock = sock
        self.process = process
        self._lock = trio.Lock()
        self._buf = bytearray()

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            view = memoryview(_frame(body))  # trio sockets have no sendall
            while view:
                n = await self._sock.send(view)
                view = view[n:]
            while True:
                if len(self._buf) >= 4:
                    (n,) = struct.unpack(">I", self._buf[:4])
                    if len(self._buf) >= 4 + n:
                        reply: dict[str, Any] = msgpack.unpackb(
                            bytes(self._buf[4 : 4 + n]), raw=False
                        )
                        del self._buf[: 4 + n]
                        break
                chunk = await self._sock.recv(1 << 20)
                if not chunk:
                    raise EmulatorError(
                        f"emulator process {self.process.pid} exited "
                        f"(status {self.process.returncode})"
                    )
                self._buf += chunk
        if not reply.get("ok"):
            raise EmulatorError(f"emulator refused {body.get('op')}: {reply.get('error')}")
        return reply

    async def restart_trace(self) -> float:
        """Restart every trace clock; returns replay time 0 as time.monotonic() seconds."""
        reply = await self.request({"op": "restart"})
        return float(reply["origin_ms"]) / 1000.0

    async def clear_lateness(self) -> None:
        await self.request({"op": "clear_lateness"})

    async def counters(self) -> dict[str, dict[str, int]]:
        reply = await self.request({"op": "counters"})
        return {str(k): dict(v) for k, v in reply["counters"].items()}

    async def statistics(self) -> dict[str, float]:
        """Emulator health: unroutable packets, failed writes, write lateness percentiles."""
        reply = await self.request({"op": "counters"})
        hist = [int(x) for x in reply["lateness"]]
        bin_ms = int(reply["lateness_bin_us"]) / 1000.0
        return {
            "unroutable": int(reply["unroutable"]),
            "write_errors": int(reply["write_errors"]),
            "written": sum(hist),
            "realtime": float(bool(reply["realtime"])),
            "late_p50_ms": _hist_quantile(hist, 0.5) * bin_ms,
            "late_p99_ms": _hist_quantile(hist, 0.99) * bin_ms,
        }


def _hist_quantile(hist: Sequence[int], q: float) -> float:
    """Upper edge (in bins) of the bin holding quantile Q; 0 for an empty histogram."""
    total = sum(hist)
    if total == 0:
        return 0.0
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= q * total:
            return float(i + 1)
    return float(len(hist))


@asynccontextmanager
async def open_emulator(
    hosts: Sequence[EmulatedHost], *, seed: int = 0, on_start: Any = None
) -> AsyncIterator[EmulatorHandle]:
    """Start the emulator process with the hosts' TUN fds, configure it, stop it on exit.

    ON_START(pid) is called right after the process starts (the topology records it in
    its ledger, so `testbed clean` can stop it after a crash).
    """
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fds = [h.tun_fd for h in hosts]
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "testbed.links.emulator_main", "--control-fd",
             str(child_sock.fileno())],
            pass_fds=[child_sock.fileno(), *fds],
        )
    finally:
        child_sock.close()
    handle = EmulatorHandle(trio.socket.from_stdlib_socket(parent_sock), process)
    try:
        if on_start is not None:
            on_start(process.pid)
        specs: list[DirectionSpec] = []
        for h in hosts:
            for spec in (h.up, h.down):
                if not any(spec is known for known in specs):
                    specs.append(spec)

        def index(spec: DirectionSpec) -> int:
            return next(i for i, known in enumerate(specs) if known is spec)

        await handle.request(
            {
                "op": "configure",
                "seed": seed,
                "specs": [_spec_to_wire(spec) for spec in specs],
                "hosts": [
                    {
                        "name": h.name,
                        "address": h.address,
                        "fd": h.tun_fd,
                        "up": index(h.up),
                        "down": index(h.down),
                    }
                    for h in hosts
                ],
            }
        )
        yield handle
    finally:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(EmulatorError, OSError), trio.move_on_after(2):
                await handle.request({"op": "stop"})
            with trio.move_on_after(3):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            parent_sock.close()


if __name__ == "__main__":
    raise SystemExit(main())
