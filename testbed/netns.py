"""Network namespaces, links, addresses, routes and sysctls through pyroute2, with a ledger.

Rules of this module:

- Every call here is synchronous and blocking; inside trio call it through
  ``trio.to_thread.run_sync``.
- Nothing is created without first being written to a :class:`Ledger`, which is persisted
  under ``/run/planfence-testbed/`` so that :func:`clean_all` can remove the leftovers of a
  run whose controller died. Removal goes in reverse order of creation and tolerates
  objects that are already gone (``ENOENT``/``ENODEV``/``ESRCH``), nothing else.
- Work that must happen *inside* a namespace (sysctls, sockets) runs on a short-lived
  dedicated thread that enters the namespace with ``setns``; worker threads of a pool are
  never moved, so they cannot leak into a namespace.
- Kernel failures are raised as :class:`KernelError`, an ``OSError`` that keeps the errno.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pyroute2 import IPRoute, NetlinkError
from pyroute2 import netns as pr_netns

STATE_DIR = Path("/run/planfence-testbed")
NETNS_DIR = Path("/var/run/netns")
TEST_NET = "198.18.0.0"
TEST_NET_LEN = 15

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.EINVAL)

T = TypeVar("T")


class KernelError(OSError):
    """A kernel call failed; ``errno`` is the kernel's, the message names the operation."""

    def __init__(self, code: int, operation: str) -> None:
        name = errno.errorcode.get(code, "?")
        super().__init__(code, f"{operation}: [{name}] {os.strerror(code)}")


def kernel_call(operation: str, fn: Callable[[], T]) -> T:
    """Run one pyroute2 call, turning NetlinkError/OSError into KernelError with its errno."""
    try:
        return fn()
    except NetlinkError as exc:
        raise KernelError(int(exc.code), operation) from exc
    except KernelError:
        raise
    except OSError as exc:
        raise KernelError(exc.errno or errno.EIO, operation) from exc


def new_prefix() -> str:
    """A run-specific name prefix, ``tb`` + 6 hex digits (interface names stay < 16 chars)."""
    return "tb" + secrets.token_hex(3)


def check_prefix(prefix: str) -> str:
    if not (prefix.startswith("tb") and 3 <= len(prefix) <= 8 and prefix.isalnum()):
        raise ValueError(f"prefix: must be 'tb' + 1-6 letters/digits, got {prefix!r}")
    return prefix


# ---------------------------------------------------------------- namespaces and links


def list_netns() -> list[str]:
    return sorted(pr_netns.listnetns())


def create_netns(name: str) -> None:
    """Create a namespace mounted at /var/run/netns/NAME (as `ip netns add` does)."""
    if name in pr_netns.listnetns():
        raise KernelError(errno.EEXIST, f"create netns {name}")
    kernel_call(f"create netns {name}", lambda: pr_netns.create(name))


def remove_netns(name: str) -> bool:
    """Remove a namespace; False if it was already gone."""
    if name not in pr_netns.listnetns():
        return False
    try:
        pr_netns.remove(name)
    except OSError as exc:
        if exc.errno in _GONE:
            return False
        raise KernelError(exc.errno or errno.EIO, f"remove netns {name}") from exc
    return True


def _ipr(netns: str | None) -> IPRoute:
    if netns is None:
        return IPRoute()
    return kernel_call(f"open netlink in {netns}", lambda: IPRoute(netns=netns))


def link_index(ifname: str, netns: str | None = None) -> int | None:
    with _ipr(netns) as ipr:
        found = kernel_call(f"lookup {ifname}", lambda: ipr.link_lookup(ifname=ifname))
    return int(found[0]) if found else None


def list_links(netns: str | None = None) -> list[str]:
    with _ipr(netns) as ipr:
        links = kernel_call("list links", lambda: ipr.get_links())
        return [str(link.get_attr("IFLA_IFNAME")) for link in links]


def remove_link(ifname: str, netns: str | None = None) -> bool:
    """Delete a link; False if it (or its namespace) was already gone."""
    if netns is not None and netns not in pr_netns.listnetns():
        return False
    try:
        with _ipr(netns) as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if not found:
                return False
            ipr.link("del", index=found[0])
    except NetlinkError as exc:
        if exc.code in _GONE:
            return False
        raise KernelError(int(exc.code), f"delete link {ifname}") from exc
    return True


def open_tun(ifname: str) -> int:
    """Create a TUN device (IFF_TUN|IFF_NO_PI) in the root namespace; returns its fd.

    The device lives as long as the fd is open (non-persistent); the fd is non-blocking.
    """
    if len(ifname) > 15:
        raise ValueError(f"ifname: at most 15 characters, got {ifname!r}")
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KernelError(exc.errno or errno.EIO, "open /dev/net/tun") from exc
    try:
        ifr = struct.pack("16sH", ifname.encode(), _IFF_TUN | _IFF_NO_PI)
        fcntl.ioctl(fd, _TUNSETIFF, ifr)
    except OSError as exc:
        os.close(fd)
        raise KernelError(exc.errno or errno.EIO, f"TUNSETIFF {ifname}") from exc
    return fd


def move_link(ifname: str, netns: str) -> None:
    with IPRoute() as ipr:
        found = kernel_call(f"lookup {ifname}", lambda: ipr.link_lookup(ifname=ifname))
        if not found:
            raise KernelError(errno.ENODEV, f"move {ifname} to {netns}")
        kernel_call(
            f"move {ifname} to {netns}",
            lambda: ipr.link("set", index=found[0], net_ns_fd=netns),
        )


def configure_host_link(netns: str, ifname: str, address: str, *, mtu: int = 1500) -> None:
    """Inside NETNS: lo up, IFNAME up with ADDRESS/32 and 198.18.0.0/15 routed through it."""
    with _ipr(netns) as ipr:
        lo = kernel_call("lookup lo", lambda: ipr.link_lookup(ifname="lo"))[0]
        kernel_call(f"{netns}: set lo up", lambda: ipr.link("set", index=lo, state="up"))
        idx = kernel_call(f"lookup {ifname}", lambda: ipr.link_lookup(ifname=ifname))
        if not idx:
            raise KernelError(errno.ENODEV, f"{netns}: configure {ifname}")
        index = idx[0]
        kernel_call(
            f"{netns}: set {ifname} mtu {mtu}",
            lambda: ipr.link("set", index=index, mtu=mtu),
        )
        kernel_call(
            f"{netns}: add {address}/32 to {ifname}",
            lambda: ipr.addr("add", index=index, address=address, prefixlen=32),
        )
        kernel_call(f"{netns}: set {ifname} up", lambda: ipr.link("set", index=index, state="up"))
        kernel_call(
            f"{netns}: route {TEST_NET}/{TEST_NET_LEN} via {ifname}",
            lambda: ipr.route("add", dst=TEST_NET, dst_len=TEST_NET_LEN, oif=index),
        )


# ---------------------------------------------------------------- work inside a namespace


def run_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run FN on a fresh thread that has entered NETNS (the calling thread never moves)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            try:
                pr_netns.setns(netns, flags=0)
            except OSError as exc:
                raise KernelError(exc.errno or errno.EIO, f"setns {netns}") from exc
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _sysctl_path(key: str) -> Path:
    if not key.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"sysctl key: dotted name of letters/digits/_, got {key!r}")
    return Path("/proc/sys") / key.replace(".", "/")


def set_sysctl(netns: str, key: str, value: str) -> None:
    """Write a per-namespace sysctl, e.g. ("net.ipv4.tcp_congestion_control", "cubic")."""
    path = _sysctl_path(key)

    def write() -> None:
        try:
            path.write_text(value)
        except OSError as exc:
            raise KernelError(exc.errno or errno.EIO, f"{netns}: sysctl {key}={value}") from exc

    run_in_netns(netns, write)


def get_sysctl(netns: str | None, key: str) -> str:
    path = _sysctl_path(key)
    if netns is None:
        return path.read_text().strip()
    return run_in_netns(netns, lambda: path.read_text().strip())


def allow_congestion_control(ledger: Ledger, cc: str) -> None:
    """Make CC settable as a namespace default.

    The kernel lets a non-root namespace default only to algorithms listed in the root
    namespace's net.ipv4.tcp_allowed_congestion_control (EPERM otherwise). That sysctl is
    global, and several topologies (lanes of one run, or several runs) may need it at
    once, so it is held jointly (:func:`hold_root_sysctl_word`): the first holder appends
    CC, the last one to leave restores the host's value.
    """
    available = get_sysctl(None, "net.ipv4.tcp_available_congestion_control").split()
    if cc not in available:
        raise ValueError(
            f"congestion_control: {cc!r} is not available here; allowed: {', '.join(available)}"
        )
    hold_root_sysctl_word(ledger, "net.ipv4.tcp_allowed_congestion_control", cc)


class _SharedSysctl:
    """The joint-holding record of one root sysctl: ``<state_dir>/sysctl-<key>.json``
    with the host's value, the value set, and the holders (prefix -> owner pid, start
    ticks). Read and written only under an exclusive flock on ``root-sysctl.lock``."""

    def __init__(self, state_dir: Path, key: str) -> None:
        self.state_dir = state_dir
        self.path = state_dir / f"sysctl-{key}.json"
        self._fd: int | None = None

    def __enter__(self) -> _SharedSysctl:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.state_dir / "root-sysctl.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def load(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        state["holders"] = {prefix: owner for prefix, owner in state.get("holders", {}).items()
                            if _same_process(int(owner[0]), owner[1])}  # live ones only
        return state

    def save(self, state: dict[str, Any] | None) -> None:
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)


def hold_root_sysctl_word(ledger: Ledger, key: str, word: str) -> None:
    """Ensure WORD is in the space-separated root sysctl KEY while LEDGER's run lives.

    A host that already lists WORD is left alone (nothing recorded). Otherwise the hold
    is written down first (the shared record, then the ledger) and the sysctl changed
    last, so a crash in between never leaves an unrecorded change; the last live holder
    to leave (:func:`release_root_sysctl_word`, at teardown or `clean`) restores the
    host's value.
    """
    with _SharedSysctl(ledger.state_dir, key) as shared:
        state = shared.load()
        current = get_sysctl(None, key)
        if state is None and word in current.split():
            return  # the host allows it by itself
        if state is None:
            state = {"previous": current, "value": current, "holders": {}}
        value = current if word in current.split() else f"{current} {word}".strip()
        state["value"] = value
        state["holders"][ledger.prefix] = ledger.owner
        shared.save(state)
        ledger.record_shared_sysctl(key)
        if value != current:
            try:
                _sysctl_path(key).write_text(value)
            except OSError as exc:
                raise KernelError(exc.errno or errno.EIO, f"sysctl {key}={value}") from exc


def release_root_sysctl_word(key: str, holder: str, state_dir: Path) -> bool:
    """Drop HOLDER's hold on KEY; the last live holder restores the host's value (unless
    someone else changed the sysctl since). True if the value was restored."""
    with _SharedSysctl(state_dir, key) as shared:
        state = shared.load()
        if state is None:
            return False
        state["holders"].pop(holder, None)
        if state["holders"]:
            shared.save(state)
            return False
        shared.save(None)
        return restore_root_sysctl(key, str(state["previous"]), str(state["value"]))


def restore_root_sysctl(key: str, previous: str, value: str) -> bool:
    """Put back PREVIOUS unless someone changed the sysctl since we set VALUE."""
    path = _sysctl_path(key)
    if path.read_text().split() != value.split():
        return False
    try:
        path.write_text(previous)
    except OSError as exc:
        raise KernelError(exc.errno or errno.EIO, f"restore sysctl {key}") from exc
    return True


def socket_in_netns(
    netns: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
) -> socket.socket:
    """A socket that belongs to NETNS (sockets keep the namespace they were created in)."""
    if netns is None:
        return socket.socket(family, kind)
    return run_in_netns(netns, lambda: socket.socket(family, kind))


# ---------------------------------------------------------------- processes


def process_start_ticks(pid: int) -> int | None:
    """Start time of PID in clock ticks (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _same_process(pid: int, start_ticks: int | None) -> bool:
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)


def stop_process(pid: int, start_ticks: int | None, *, grace_s: float = 2.0) -> bool:
    """SIGTERM then SIGKILL one recorded process, only if it is still the same process."""
    if not _same_process(pid, start_ticks):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _same_process(pid, start_ticks) or _is_zombie(pid):
            _reap(pid)
            return True
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


# ---------------------------------------------------------------- ledger


@dataclass
class Ledger:
    """What one run created, in order; persisted so a later `clean` can undo a crashed run."""

    prefix: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    owner_pid: int = field(default_factory=os.getpid)
    state_dir: Path = STATE_DIR

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        self._lock = threading.Lock()
        self._owner_ticks = process_start_ticks(self.owner_pid)

    @property
    def path(self) -> Path:
        return self.state_dir / f"{self.prefix}.json"

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = {
            "prefix": self.prefix,
            "owner_pid": self.owner_pid,
            "owner_start_ticks": self._owner_ticks,
            "entries": self.entries,
        }
        tmp.write_text(json.dumps(body))
        tmp.replace(self.path)

    def _add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries.append(entry)
            self._save()

    def record_netns(self, name: str) -> None:
        """Record BEFORE creating: a crash in between leaves an entry, never an orphan."""
        self._check_name(name)
        self._add({"kind": "netns", "name": name})

    def record_link(self, ifname: str, netns: str | None) -> None:
        self._check_name(ifname)
        self._add({"kind": "link", "name": ifname, "netns": netns})

    def record_process(self, pid: int) -> None:
        self._add({"kind": "process", "pid": pid, "start_ticks": process_start_ticks(pid)})

    @property
    def owner(self) -> list[Any]:
        """[pid, start ticks] of the run that owns this ledger (how others tell it lives)."""
        return [self.owner_pid, self._owner_ticks]

    def record_shared_sysctl(self, key: str) -> None:
        """This run holds root sysctl KEY jointly (:func:`hold_root_sysctl_word`); teardown
        releases the hold. (Ledgers written by older versions may hold "sysctl" entries,
        a private change with its previous value; teardown still undoes those.)"""
        self._add({"kind": "shared_sysctl", "key": key, "holder": self.prefix,
                   "state_dir": str(self.state_dir)})

    def _check_name(self, name: str) -> None:
        if not name.startswith(self.prefix):
            raise ValueError(f"name {name!r} lacks the run prefix {self.prefix!r}")

    def teardown(self) -> list[str]:
        """Remove everything recorded, newest first; returns what was removed.

        Keeps going after a failure and raises the first one at the end, so one stuck
        object does not leak the others.
        """
        removed: list[str] = []
        first_error: BaseException | None = None
        with self._lock:
            entries = list(reversed(self.entries))
        for entry in entries:
            try:
                if _undo(entry):
                    removed.append(_describe(entry))
            except Exception as exc:
                first_error = first_error or exc
            with self._lock:
                self.entries.remove(entry)
                self._save()
        with self._lock, contextlib.suppress(FileNotFoundError):
            if not self.entries:
                self.path.unlink()
        if first_error is not None:
            raise first_error
        return removed


def _describe(entry: dict[str, Any]) -> str:
    if entry["kind"] == "process":
        return f"process {entry['pid']}"
    if entry["kind"] == "sysctl":
        return f"sysctl {entry['key']}={entry['previous']} (restored)"
    if entry["kind"] == "shared_sysctl":
        return f"sysctl {entry['key']} (host value restored)"
    where = f" (in {entry['netns']})" if entry.get("netns") else ""
    return f"{entry['kind']} {entry['name']}{where}"


def _undo(entry: dict[str, Any]) -> bool:
    kind = entry["kind"]
    if kind == "netns":
        return remove_netns(str(entry["name"]))
    if kind == "link":
        return remove_link(str(entry["name"]), entry.get("netns"))
    if kind == "process":
        return stop_process(int(entry["pid"]), entry.get("start_ticks"))
    if kind == "sysctl":
        return restore_root_sysctl(str(entry["key"]), str(entry["previous"]), str(entry["value"]))
    if kind == "shared_sysctl":
        return release_root_sysctl_word(str(entry["key"]), str(entry["holder"]),
                                        Path(str(entry["state_dir"])))
    raise ValueError(f"ledger entry kind: netns|link|process|sysctl|shared_sysctl, got {kind!r}")


def clean_all(state_dir: Path = STATE_DIR) -> list[str]:
    """Undo the ledgers of runs whose owner process is dead; never touches unrecorded things."""
    removed: list[str] = []
    if not state_dir.is_dir():
        return removed
    for path in sorted(state_dir.glob("tb*.json")):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _same_process(int(body["owner_pid"]), body.get("owner_start_ticks")):
            continue  # a live run owns it
        ledger = Ledger(
            prefix=str(body["prefix"]),
            entries=list(body["entries"]),
            owner_pid=int(body["owner_pid"]),
            state_dir=state_dir,
        )
        ledger._owner_ticks = body.get("owner_start_ticks")
        removed.extend(ledger.teardown())
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return removed
