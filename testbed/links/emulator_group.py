"""One group of hosts inside the emulator process: its link core and its control ops.

A group is one topology's hosts (their TUN fds, their per-direction link specs). The
emulator process (``testbed.links.emulator``) serves one group on an inherited control
socket, or, as the shared emulator of a process's lanes, any number of groups, each on
a control connection of its own; either way every control message below acts on the
group of the connection it arrived on.

Control protocol: ``protocols.wire`` frames (4-byte big-endian length + msgpack map),
the same codec as the data and control planes, with a larger frame cap
(:data:`CONTROL_MAX_FRAME_BYTES`: a configure message carries whole traces).
Parent -> child (``testbed.links.userspace``):
``{"op": "configure", "specs": [...], "hosts": [...], "seed": int}`` first (each
distinct direction spec once, stamps as packed int64; hosts name the index of their up
and down spec and their TUN fd as the parent numbers it), then ``{"op": "restart"}``,
``{"op": "counters"}``, ``{"op": "clear_lateness"}`` (also starts a new statistics
window), ``{"op": "window"}`` (per direction since the window started: bytes, packets,
capacity, queueing delay percentiles), ``{"op": "log_start", "dir": str, "label": str}``
(a Mahimahi mm-link log per host and direction, ``<dir>/<host>.up.log`` /
``.down.log``, and its drops and losses in ``.up.drops`` / ``.down.drops``), ``{"op": "log_stop"}``, ``{"op": "fault", ...}``, ``{"op": "stop"}``.
Child -> parent: ``{"ok": true, ...}`` or ``{"ok": false, "error": str}``.
"""

from __future__ import annotations

import array
import os
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from protocols import wire
from protocols.errors import RemoteProtocolError
from testbed.links.core import EmulatorCore, HostLinks
from testbed.links.linklog import EXTRA_SUFFIX, LOG_SUFFIX, LinkLog
from testbed.links.memo import ByIdentity, ByKey
from testbed.links.model import DirectionSpec, LinkQueue
from testbed.links.opportunities import Opportunities

CONTROL_MAX_FRAME_BYTES = 64 * 1024 * 1024
#: entries of one map or array in a control message: a configure message lists every
#: host, a counters reply maps every host (the hosts one emulator group may have)
CONTROL_MAX_ITEMS = 1 << 20
LATE_BIN_US = 25


def encode_message(body: dict[str, Any]) -> bytes:
    """One control message as a wire frame."""
    return wire.encode_frame(wire.pack(body, max_frame_bytes=CONTROL_MAX_FRAME_BYTES),
                             max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


def decode_message(body: bytes) -> dict[str, Any]:
    message = wire.unpack(body, max_frame_bytes=CONTROL_MAX_FRAME_BYTES,
                          max_items=CONTROL_MAX_ITEMS)
    if not isinstance(message, dict):
        raise RemoteProtocolError("emulator control message is not a map")
    return message


def new_decoder() -> wire.FrameDecoder:
    return wire.FrameDecoder(max_frame_bytes=CONTROL_MAX_FRAME_BYTES)


#: Stamps on the wire: packed int64, once per stamp tuple (the controller's side) and
#: back once per distinct byte string (the emulator's side).
_stamps_to_wire: ByIdentity[tuple[int, ...], bytes] = ByIdentity(
    lambda stamps: array.array("q", stamps).tobytes())
_stamps_from_wire: ByKey[bytes, tuple[int, ...]] = ByKey()


def spec_to_wire(spec: DirectionSpec) -> dict[str, Any]:
    # not dataclasses.asdict: it deep-copies the (long) stamp tuple
    d = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "stamps_ms"}
    stamps = spec.stamps_ms
    d["stamps"] = None if stamps is None else _stamps_to_wire(stamps)
    return d


def _spec_from_wire(d: dict[str, Any]) -> DirectionSpec:
    raw = d.pop("stamps")
    stamps = None if raw is None else _stamps_from_wire.get(
        bytes(raw), lambda: tuple(array.array("q", raw)))
    for key in ("gilbert", "delay_steps"):
        if d.get(key) is not None:
            d[key] = tuple(tuple(x) if isinstance(x, list) else x for x in d[key])
    return DirectionSpec(stamps_ms=stamps, **d)


#: A trace's opportunity schedule at an offset, shared by every group of this emulator
#: that replays it (a schedule is immutable; building one costs 25 ms for AT&T's
#: downlink).
_schedules: ByKey[tuple[bytes, int, float], Opportunities | None] = ByKey()


def _opportunities(wire_spec: Mapping[str, Any], spec: DirectionSpec) -> Opportunities | None:
    raw = wire_spec.get("stamps")
    if raw is None or spec.period_ms is None:
        return spec.opportunities()
    return _schedules.get((bytes(raw), spec.period_ms, spec.offset_ms), spec.opportunities)


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _build_core(msg: dict[str, Any], fd_map: Mapping[int, int] | None,
                ) -> tuple[EmulatorCore, list[int], list[DirectionSpec]]:
    seed = int(msg["seed"])
    specs = [_spec_from_wire(dict(d)) for d in msg["specs"]]
    opportunities = [_opportunities(d, spec)  # immutable: shared
                     for d, spec in zip(msg["specs"], specs, strict=True)]
    hosts: list[HostLinks] = []
    fds: list[int] = []
    now = _now_ms()

    def queue(index: int, rng_seed: int) -> LinkQueue:
        return specs[index].make_queue(random.Random(rng_seed), now, opportunities[index])

    for i, h in enumerate(msg["hosts"]):
        up = queue(int(h["up"]), seed * 1000 + 2 * i)
        down = queue(int(h["down"]), seed * 1000 + 2 * i + 1)
        hosts.append(HostLinks(h["name"], socket.inet_aton(h["address"]), up, down))
        fd = int(h["fd"])
        fds.append(fd if fd_map is None else fd_map[fd])
    return EmulatorCore(hosts, seed=seed), fds, specs


@dataclass
class GroupState:
    """One group: what the loop and its control handler share. ``fd_map`` maps the
    parent's TUN fd numbers to this process's (None: the fds were inherited as is)."""

    realtime: bool
    fd_map: dict[int, int] | None = None
    core: EmulatorCore | None = None
    fds: list[int] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    lateness: list[int] = field(default_factory=lambda: [0] * 200)  # LATE_BIN_US bins
    late_max_us: int = 0
    write_errors: int = 0
    specs: list[DirectionSpec] = field(default_factory=list)
    spec_of: dict[tuple[int, str], int] = field(default_factory=dict)


def handle(st: GroupState, msg: dict[str, Any]) -> dict[str, Any] | None:
    """One control request; the reply, or None for `stop`."""
    op = msg.get("op")
    if op == "configure":
        st.core, st.fds, st.specs = _build_core(msg, st.fd_map)
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
            "lateness_bin_us": LATE_BIN_US,
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
            log_stop(st)
            return {"ok": False, "error": f"log_start: {exc}"}
        return {"ok": True}
    if op == "log_stop":
        log_stop(st)
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


def _log_start(st: GroupState, directory: str, label: str) -> None:
    assert st.core is not None
    log_stop(st)
    os.makedirs(directory, exist_ok=True)
    now = _now_ms()
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
            extra = open(path.removesuffix(LOG_SUFFIX) + EXTRA_SUFFIX, "w",  # noqa: SIM115
                         encoding="ascii", buffering=1 << 16)
            queue.log = LinkLog(handle, origin_ms=queue.origin_ms,
                                opportunities=queue.opportunities, header=header,
                                extra=extra, start_ms=now)


def log_stop(st: GroupState) -> None:
    if st.core is None:
        return
    now = _now_ms()
    for h in st.core.hosts:
        for queue in (h.up, h.down):
            if queue.log is not None:
                log, queue.log = queue.log, None
                log.close(now)
