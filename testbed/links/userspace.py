"""The userspace link backend: a TUN device per host and one emulator process.

Rules:

- Host i's TUN device is ``<prefix>t<i>``, recorded in the ledger first, then created
  by a thread inside the host's namespace and given the host's /32 address with
  198.18.0.0/15 routed through it, so no traffic can leave for anywhere else
  (``kernel.open_host_tun``: one netlink socket, nothing moved between namespaces).
- The emulator (``python -m testbed.links.emulator``) inherits every TUN fd and runs
  the link model (``testbed.links.model``) in an epoll loop; its pid is recorded in
  the ledger as soon as it starts. With ``shared_emulator`` the topology's hosts are a
  group of the process's shared emulator instead (``testbed.links.shared_emulator``:
  one real-time loop for every lane), which gets the TUN fds over SCM_RIGHTS. It is a process, not a thread of the controller, so
  the controller's GIL never delays a packet (docs/emulator.md).
- The devices are non-persistent: they vanish when the last fd closes, which happens
  after the emulator has stopped.
- Every host gets its own link from the profile (``NetworkProfile.link_of``); hosts
  with equal links share one direction spec, which travels to the emulator once.
- ``start_log(directory, label)`` makes the emulator write each host's two directions
  as Mahimahi-format packet logs (``testbed.links.linklog``) until ``stop_log()``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from testbed.errors import LinkFailure
from testbed.host import kernel
from testbed.host.ledger import Ledger, scratch_ledger
from testbed.links.backend import LinkHost, ProbeResult
from testbed.links.emulator_group import (
    decode_message,
    encode_message,
    new_decoder,
    spec_to_wire,
)
from testbed.links.linkspec import LinkSpec, NetworkProfile
from testbed.links.model import DirectionSpec, direction_spec
from testbed.links.shared_emulator import SharedEmulator

NAME = "userspace"
PROBE_NAMES = ("tun",)


class EmulatorError(LinkFailure):
    """The emulator process failed or refused its configuration."""


@dataclass(frozen=True)
class EmulatedHost:
    name: str
    address: str
    tun_fd: int
    up: DirectionSpec
    down: DirectionSpec


def tun_name(prefix: str, index: int) -> str:
    return f"{prefix}t{index}"


class _Process(Protocol):
    """What a handle needs of the emulator process: a private one (trio.Process) or the
    process's shared one (``SharedEmulator``)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...


class EmulatorHandle:
    """The controller's side of the emulator: one request at a time."""

    def __init__(self, sock: trio.socket.SocketType, process: _Process) -> None:
        self._sock = sock
        self.process = process
        self._lock = trio.Lock()
        self._decoder = new_decoder()

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            view = memoryview(encode_message(body))  # trio sockets have no sendall
            try:
                while view:
                    n = await self._sock.send(view)
                    view = view[n:]
                while (frame := self._decoder.next_frame()) is None:
                    chunk = await self._sock.recv(1 << 20)
                    if not chunk:
                        raise EmulatorError(f"emulator process {self.process.pid} exited "
                                            f"(status {self.process.returncode})")
                    self._decoder.receive_data(chunk)
            except OSError as exc:  # its end of the control socket is gone with it
                raise EmulatorError(f"emulator process {self.process.pid} exited (status "
                                    f"{self.process.returncode}; {exc!r})") from None
        reply = decode_message(frame)
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

    async def fault(self, host: str, kind: str, *, seconds: float, rate: float = 1.0
                    ) -> dict[str, int]:
        """Start fault KIND (testbed.links.core.FAULT_KINDS) on HOST's packets."""
        reply = await self.request({"op": "fault", "host": host, "kind": kind,
                                    "seconds": seconds, "rate": rate})
        return {str(k): int(v) for k, v in reply["faulted"].items()}

    async def statistics(self) -> dict[str, float]:
        """Emulator health (unroutable packets, failed writes, write lateness percentiles
        and maximum) and, per direction over every host, what the links did since the
        window started: ``{up,down}_qdelay_p50_ms`` / ``_p95_ms`` / ``_max_ms``,
        ``_utilisation`` (bytes carried / capacity offered), ``_bytes`` (NaN where a
        figure does not apply, e.g. the utilisation of an unlimited link)."""
        reply = await self.request({"op": "counters"})
        window = (await self.request({"op": "window"}))["window"]
        hist = [int(x) for x in reply["lateness"]]
        bin_ms = int(reply["lateness_bin_us"]) / 1000.0
        out: dict[str, float] = {
            "unroutable": int(reply["unroutable"]),
            "write_errors": int(reply["write_errors"]),
            "written": sum(hist),
            "realtime": float(bool(reply["realtime"])),
            "late_p50_ms": hist_quantile(hist, 0.5) * bin_ms,
            "late_p99_ms": hist_quantile(hist, 0.99) * bin_ms,
            "late_max_ms": int(reply["late_max_us"]) / 1000.0,
        }
        for side in ("up", "down"):
            for key in ("qdelay_p50_ms", "qdelay_p95_ms", "qdelay_max_ms", "utilisation",
                        "bytes", "capacity_bytes"):
                value = window[side].get(key)
                out[f"{side}_{key}"] = float("nan") if value is None else float(value)
        return out

    async def start_log(self, directory: str, label: str) -> None:
        await self.request({"op": "log_start", "dir": directory, "label": label})

    async def stop_log(self) -> None:
        await self.request({"op": "log_stop"})


def hist_quantile(hist: Sequence[int], q: float) -> float:
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
async def open_emulator(hosts: Sequence[EmulatedHost], *, seed: int = 0,
                        on_start: Callable[[int], None] | None = None,
                        shared: bool = False) -> AsyncIterator[EmulatorHandle]:
    """An emulator running the hosts' links: a process of its own (started with their TUN
    fds, stopped on exit), or with ``shared`` a group in this process's shared emulator
    (``testbed.links.shared_emulator``). Configured before it is yielded.

    ON_START(pid) is called right after a private process starts (the backend records it
    in its ledger, so `testbed clean` can stop it after a crash).
    """
    if shared:
        async with _open_group(hosts) as handle:
            await _configure(handle, hosts, seed)
            yield handle
        return
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fds = [h.tun_fd for h in hosts]
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "testbed.links.emulator", "--control-fd",
             str(child_sock.fileno())],
            pass_fds=[child_sock.fileno(), *fds],
        )
    finally:
        child_sock.close()
    handle = EmulatorHandle(trio.socket.from_stdlib_socket(parent_sock), process)
    try:
        if on_start is not None:
            on_start(process.pid)
        await _configure(handle, hosts, seed)
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


@asynccontextmanager
async def _open_group(hosts: Sequence[EmulatedHost]) -> AsyncIterator[EmulatorHandle]:
    service = await trio.to_thread.run_sync(SharedEmulator.acquire)
    try:
        sock = await trio.to_thread.run_sync(service.attach, [h.tun_fd for h in hosts])
        handle = EmulatorHandle(trio.socket.from_stdlib_socket(sock), service)
        try:
            yield handle
        finally:
            with trio.CancelScope(shield=True):
                with contextlib.suppress(EmulatorError, OSError), trio.move_on_after(2):
                    await handle.request({"op": "stop"})  # ends the group, not the process
                sock.close()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(service.release)


async def _configure(handle: EmulatorHandle, hosts: Sequence[EmulatedHost],
                     seed: int) -> None:
    specs: list[DirectionSpec] = []
    for h in hosts:
        for spec in (h.up, h.down):
            if not any(spec is known for known in specs):
                specs.append(spec)

    def index(spec: DirectionSpec) -> int:
        return next(i for i, known in enumerate(specs) if known is spec)

    await handle.request({
        "op": "configure", "seed": seed,
        "specs": [spec_to_wire(spec) for spec in specs],
        "hosts": [{"name": h.name, "address": h.address, "fd": h.tun_fd,
                   "up": index(h.up), "down": index(h.down)} for h in hosts],
    })


class UserspaceLinks:
    """The live userspace backend (``testbed.links.backend.LinkBackend``)."""

    def __init__(self, emulator: EmulatorHandle) -> None:
        self.emulator = emulator

    @property
    def name(self) -> str:
        return NAME

    async def restart_trace(self) -> float:
        return await self.emulator.restart_trace()

    async def counters(self) -> dict[str, dict[str, int]]:
        return await self.emulator.counters()

    async def statistics(self) -> dict[str, float]:
        return await self.emulator.statistics()

    async def clear_statistics(self) -> None:
        await self.emulator.clear_lateness()

    async def start_log(self, directory: str, label: str) -> None:
        await self.emulator.start_log(directory, label)

    async def stop_log(self) -> None:
        await self.emulator.stop_log()

    async def fault(self, host: str, kind: str, *, seconds: float, rate: float = 1.0
                    ) -> dict[str, int]:
        return await self.emulator.fault(host, kind, seconds=seconds, rate=rate)


def _setup_tun(ledger: Ledger, host: LinkHost, ifname: str) -> int:
    ledger.record_link(ifname, host.netns)
    return kernel.open_host_tun(host.netns, ifname, host.address)


@asynccontextmanager
async def open_userspace_links(profile: NetworkProfile, hosts: Sequence[LinkHost], *,
                               prefix: str, ledger: Ledger, trace_offset_s: float = 0.0,
                               seed: int = 0, shared_emulator: bool = False,
                               ) -> AsyncIterator[UserspaceLinks]:
    """TUN devices for ``hosts`` and an emulator running ``profile``'s links (with
    ``shared_emulator``, a group of this process's shared emulator)."""
    if profile.link is None:
        raise ValueError(f"profile {profile.name!r} has no link to emulate")
    offset_ms = trace_offset_s * 1000.0
    specs: dict[tuple[LinkSpec, str], DirectionSpec] = {}

    def spec(link: LinkSpec | None, side: str) -> DirectionSpec:
        assert link is not None
        if (link, side) not in specs:
            specs[(link, side)] = direction_spec(link, side, offset_ms=offset_ms)
        return specs[(link, side)]

    links = profile.links_of([h.name for h in hosts])
    fds: list[int] = []
    try:
        for i, host in enumerate(hosts):
            fds.append(await trio.to_thread.run_sync(
                _setup_tun, ledger, host, tun_name(prefix, i)))
        emulated = [EmulatedHost(h.name, h.address, fd, spec(link, "up"), spec(link, "down"))
                    for h, fd, link in zip(hosts, fds, links, strict=True)]
        async with open_emulator(emulated, seed=seed, on_start=ledger.record_process,
                                 shared=shared_emulator) as emulator:
            yield UserspaceLinks(emulator)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def probes() -> list[ProbeResult]:
    """Can a TUN device be created inside a fresh namespace here? (backend rule 4)."""
    if os.geteuid() != 0:
        return [ProbeResult("tun", False, "not probed: needs root (run `testbed doctor` as root)")]
    if not os.path.exists(kernel.TUN_PATH):
        return [ProbeResult("tun", False, f"{kernel.TUN_PATH} does not exist (no TUN driver; "
                            "load it with `modprobe tun`)")]
    try:
        with scratch_ledger() as ledger:
            netns = f"{ledger.prefix}-probe"
            ledger.record_netns(netns)
            kernel.create_netns(netns)
            ifname = tun_name(ledger.prefix, 0)
            ledger.record_link(ifname, netns)
            fd = kernel.run_in_netns(netns, lambda: kernel.open_tun(ifname))
            os.close(fd)
    except OSError as exc:
        return [ProbeResult("tun", False, f"TUN device in a scratch namespace failed: {exc}")]
    return [ProbeResult("tun", True, f"TUN device {ifname} created via TUNSETIFF in scratch "
                        f"namespace {netns} (removed)")]
