"""The userspace emulator process (the child side of the userspace link backend).

The child (``python -m testbed.links.emulator --control-fd N``) inherits every
host's TUN fd and one end of a socketpair. It runs `userspace.EmulatorCore` in a plain
select() loop: select's timeout has microsecond resolution and the timer slack is set
to 1 ns, so releases are ~0.1 ms late at worst, where an epoll loop (trio's) would be
~1 ms late. It is a process, not a thread of the controller, so the controller's GIL
(5 ms switch interval) never delays a packet. See docs/emulator.md.

Control protocol on the socketpair: ``protocols.wire`` frames (4-byte big-endian length
+ msgpack map), the same codec as the data and control planes, with a larger frame cap
(:data:`CONTROL_MAX_FRAME_BYTES`: a configure message carries whole traces).
Parent -> child (``testbed.links.userspace``):
``{"op": "configure", "specs": [...], "hosts": [...], "seed": int}`` first (each distinct direction spec once, stamps as packed int64; hosts name the index of
their up and down spec), then
``{"op": "restart"}``, ``{"op": "counters"}``, ``{"op": "clear_lateness"}``,
``{"op": "stop"}``. Child -> parent:
``{"ok": true, ...}`` or ``{"ok": false, "error": str}``. EOF on the socket (the
controller died) stops the child, as do SIGTERM and SIGINT.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import errno
import os
import random
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from protocols import wire
from protocols.errors import RemoteProtocolError
from testbed.links.model import DirectionSpec, EmulatorCore, HostLinks, LinkQueue

_PR_SET_TIMERSLACK = 29
CONTROL_MAX_FRAME_BYTES = 64 * 1024 * 1024
_READ_BATCH = 64
_LATE_BIN_US = 25
_SPIN_MS = 0.3


# ---------------------------------------------------------------- framing


def encode_message(body: dict[str, Any]) -> bytes:
    """One control message as a wire frame."""
    return wire.encode_frame(wire.pack(body, max_frame_bytes=CONTROL_MAX_FRAME_BYTES),
                             max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


def decode_message(body: bytes) -> dict[str, Any]:
    message = wire.unpack(body, max_frame_bytes=CONTROL_MAX_FRAME_BYTES)
    if not isinstance(message, dict):
        raise RemoteProtocolError("emulator control message is not a map")
    return message


def new_decoder() -> wire.FrameDecoder:
    return wire.FrameDecoder(max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


def spec_to_wire(spec: DirectionSpec) -> dict[str, Any]:
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
    opportunities = [spec.opportunities() for spec in specs]  # immutable: shared
    hosts: list[HostLinks] = []
    fds: list[int] = []
    now = _now_ms()

    def queue(index: int, rng_seed: int) -> LinkQueue:
        spec = specs[index]
        return LinkQueue(
            opportunities[index], delay_ms=spec.delay_ms, loss_pct=spec.loss_pct,
            queue_packets=spec.queue_packets, queue_bytes=spec.queue_bytes,
            rng=random.Random(rng_seed), origin_ms=now,
        )

    for i, h in enumerate(msg["hosts"]):
        up = queue(int(h["up"]), seed * 1000 + 2 * i)
        down = queue(int(h["down"]), seed * 1000 + 2 * i + 1)
        hosts.append(HostLinks(h["name"], socket.inet_aton(h["address"]), up, down))
        fds.append(int(h["fd"]))
    return EmulatorCore(hosts, seed=seed), fds


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
            "faulted": dict(st.core.faulted),
        }
    if op == "clear_lateness":
        st.lateness = [0] * len(st.lateness)
        return {"ok": True}
    if op == "fault":
        names = [h.name for h in st.core.hosts]
        if msg.get("host") not in names:
            return {"ok": False, "error": f"host: {msg.get('host')!r} not one of "
                    f"{', '.join(names)}"}
        try:
            st.core.add_fault(str(msg.get("kind")), names.index(msg["host"]),
                              now_ms=_now_ms(), seconds=float(msg.get("seconds", 0)),
                              rate=float(msg.get("rate", 1.0)))
        except (TypeError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "faulted": dict(st.core.faulted)}
    return {"ok": False, "error": f"op: {op!r} is not one of configure, restart, "
            "counters, clear_lateness, fault, stop"}


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
    decoder = new_decoder()
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
                try:
                    bodies = decoder.feed(chunk)
                    for body in bodies:
                        reply = _handle(st, decode_message(body))
                        ctl.setblocking(True)
                        ctl.sendall(encode_message({"ok": True} if reply is None else reply))
                        ctl.setblocking(False)
                        if reply is None:
                            return 0
                except RemoteProtocolError as exc:
                    print(f"emulator: bad control message: {exc}", file=sys.stderr)
                    return 2
    except _Stop:
        return 0
    finally:
        ctl.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.links.emulator")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--spin-ms", type=float, default=_SPIN_MS)
    parser.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO; 0 = off")
    args = parser.parse_args(argv)
    return run_child(args.control_fd, spin_ms=args.spin_ms, rt_priority=args.rt_priority)


if __name__ == "__main__":
    raise SystemExit(main())
