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
``{"op": "restart"}``, ``{"op": "counters"}``, ``{"op": "clear_lateness"}`` (also
starts a new statistics window), ``{"op": "window"}`` (per direction since the window
started: bytes, packets, capacity, queueing delay percentiles),
``{"op": "log_start", "dir": str, "label": str}`` (a Mahimahi-format packet log per host
and direction, ``<dir>/<host>.up.log`` / ``.down.log``), ``{"op": "log_stop"}``,
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
from testbed.links.core import EmulatorCore, HostLinks
from testbed.links.linklog import LinkLog
from testbed.links.model import DirectionSpec, LinkQueue

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
    for key in ("gilbert", "delay_steps"):
        if d.get(key) is not None:
            d[key] = tuple(tuple(x) if isinstance(x, list) else x for x in d[key])
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


def _build_core(msg: dict[str, Any]) -> tuple[EmulatorCore, list[int], list[DirectionSpec]]:
    seed = int(msg["seed"])
    specs = [_spec_from_wire(dict(d)) for d in msg["specs"]]
    opportunities = [spec.opportunities() for spec in specs]  # immutable: shared
    hosts: list[HostLinks] = []
    fds: list[int] = []
    now = _now_ms()

    def queue(index: int, rng_seed: int) -> LinkQueue:
        return specs[index].make_queue(random.Random(rng_seed), now, opportunities[index])

    for i, h in enumerate(msg["hosts"]):
        up = queue(int(h["up"]), seed * 1000 + 2 * i)
        down = queue(int(h["down"]), seed * 1000 + 2 * i + 1)
        hosts.append(HostLinks(h["name"], socket.inet_aton(h["address"]), up, down))
        fds.append(int(h["fd"]))
    return EmulatorCore(hosts, seed=seed), fds, specs


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
    late_max_us: int = 0
    write_errors: int = 0
    specs: list[DirectionSpec] = field(default_factory=list)
    spec_of: dict[tuple[int, str], int] = field(default_factory=dict)


def _handle(st: _State, msg: dict[str, Any]) -> dict[str, Any] | None:
    """One control request; the reply, or None for `stop`."""
    op = msg.get("op")
    if op == "configure":
        st.core, st.fds, st.specs = _build_core(msg)
        st.spec_of = {(i, side): int(h[side]) for i, h in enumerate(msg["hosts"])
                      for side in ("up", "down")}
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
            "late_max_us": st.late_max_us,
        }
    if op == "clear_lateness":
        st.lateness = [0] * len(st.lateness)
        st.late_max_us = 0
        now = _now_ms()
        for h in st.core.hosts:
            h.up.clear_window(now)
            h.down.clear_window(now)
        return {"ok": True}
    if op == "window":
        return {"ok": True, "window": window_statistics(st.core, _now_ms())}
    if op == "log_start":
        try:
            _log_start(st, str(msg["dir"]), str(msg.get("label", "")))
        except OSError as exc:
            _log_stop(st)
            return {"ok": False, "error": f"log_start: {exc}"}
        return {"ok": True}
    if op == "log_stop":
        _log_stop(st)
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
            "counters, clear_lateness, window, log_start, log_stop, fault, stop"}


def _percentile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def window_statistics(core: EmulatorCore, now_ms: float) -> dict[str, dict[str, float | None]]:
    """Per direction, over every host: what the window carried and how long it queued."""
    out: dict[str, dict[str, float | None]] = {}
    for side in ("up", "down"):
        queues = [getattr(h, side) for h in core.hosts]
        sojourns = sorted(x for q in queues for x in q.sojourns_ms)
        capacities = [q.capacity_bytes(now_ms) for q in queues]
        shaped = [(q.window_bytes, c) for q, c in zip(queues, capacities, strict=True)
                  if c is not None]
        capacity = sum(c for _, c in shaped)
        out[side] = {
            "bytes": float(sum(q.window_bytes for q in queues)),
            "packets": float(sum(q.window_released for q in queues)),
            "capacity_bytes": float(capacity) if shaped else None,
            "utilisation": (sum(b for b, _ in shaped) / capacity) if capacity else None,
            "qdelay_p50_ms": _percentile(sojourns, 0.5) if sojourns else None,
            "qdelay_p95_ms": _percentile(sojourns, 0.95) if sojourns else None,
            "qdelay_max_ms": sojourns[-1] if sojourns else None,
        }
    return out


def _queue_text(spec: DirectionSpec) -> str:
    bounds = [f"packets={spec.queue_packets}"] if spec.queue_packets is not None else []
    if spec.queue_bytes is not None:
        bounds.append(f"bytes={spec.queue_bytes}")
    if spec.queue_kind == "codel":
        bounds += [f"target={spec.codel_target_ms:g}", f"interval={spec.codel_interval_ms:g}"]
    return f"{spec.queue_kind} [{', '.join(bounds)}]"


def _log_start(st: _State, directory: str, label: str) -> None:
    assert st.core is not None
    _log_stop(st)
    os.makedirs(directory, exist_ok=True)
    for i, h in enumerate(st.core.hosts):
        for side in ("up", "down"):
            queue: LinkQueue = getattr(h, side)
            spec = st.specs[st.spec_of[(i, side)]]
            path = os.path.join(directory, f"{h.name}.{side}.log")
            trace = os.path.basename(spec.trace_name) if spec.trace_name else (
                f"{spec.rate_kbit:g} kbit/s" if spec.rate_kbit else "unlimited")
            header = [f"mahimahi mm-link ({side}link) [{trace}] > {path}",
                      "command line: planfence-testbed userspace emulator (testbed.links."
                      "emulator)", f"queue: {_queue_text(spec)}",
                      f"testbed: host {h.name}, {label}"]
            handle = open(path, "w", encoding="ascii", buffering=1 << 20)  # noqa: SIM115
            queue.log = LinkLog(handle, origin_ms=queue.origin_ms,
                                opportunities=queue.opportunities, header=header)


def _log_stop(st: _State) -> None:
    if st.core is None:
        return
    now = _now_ms()
    for h in st.core.hosts:
        for queue in (h.up, h.down):
            if queue.log is not None:
                log, queue.log = queue.log, None
                log.close(now)


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
        if late_us > st.late_max_us:
            st.late_max_us = late_us
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
        _log_stop(st)
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
