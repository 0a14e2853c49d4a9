"""Kernel calls through pyroute2: namespaces, links, TUN devices, addresses, routes, sysctls.

Rules of this module:

- Every call here is synchronous and blocking; inside trio call it through
  ``trio.to_thread.run_sync``.
- It creates what it is asked to and nothing else; recording what a run created (so
  it can be removed after a crash) is :mod:`testbed.host.ledger`'s job, and callers
  record *before* they create.
- Work that must happen *inside* a namespace (sysctls, sockets, netlink) runs on a
  short-lived dedicated thread that enters the namespace with ``setns``; worker threads
  of a pool are never moved, so they cannot leak into a namespace. A new namespace is
  made the same way (a thread unshares and the namespace is bind-mounted from its
  /proc/TID entry). pyroute2's own ``netns=`` and ``netns.create`` fork a helper of this
  process for each call instead: 20-35 ms of CPU each in a controller of 16 lanes, 15
  times per team (docs/benchmarks.md, "A team's start").
- Kernel failures are raised as :class:`KernelError`, an ``OSError`` that keeps the errno
  and is a :class:`testbed.errors.HostError` (the host refused).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute, NetlinkError
from pyroute2 import config as pr_config
from pyroute2 import netns as pr_netns

from testbed.errors import HostError

NETNS_DIR = Path("/var/run/netns")
TUN_PATH = "/dev/net/tun"
TEST_NET = "198.18.0.0"
TEST_NET_LEN = 15

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)
GONE_ERRNOS = (errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.EINVAL)
HELPER_TIMEOUT_S = 60
"""pyroute2's ``netns.create`` and ``IPRoute(netns=...)`` fork a helper process (this
module no longer calls them; the netem backend and the lab tools still do) and give it
2 s to answer; on a loaded host, and in the VM lane's
TCG guest beside a busy host, fork and answer took longer and the call failed as a
TimeoutError, which has no errno (EIO here). A kernel call that slow is slow, not
failed: the helper gets this long."""
pr_config.default_communicate_timeout = max(pr_config.default_communicate_timeout,
                                            HELPER_TIMEOUT_S)
"""Errnos that mean "already gone" when removing something."""

T = TypeVar("T")


class KernelError(HostError, OSError):
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


# ---------------------------------------------------------------- namespaces and links


def list_netns() -> list[str]:
    return sorted(pr_netns.listnetns())


def create_netns(name: str) -> None:
    """Create a namespace mounted at /var/run/netns/NAME (as `ip netns add` does): a
    fresh thread unshares its network namespace and pyroute2 bind-mounts it by the
    thread's id."""
    if name in pr_netns.listnetns():
        raise KernelError(errno.EEXIST, f"create netns {name}")

    def make() -> None:
        if _LIBC.unshare(_CLONE_NEWNET) != 0:
            raise KernelError(ctypes.get_errno(), f"create netns {name}: unshare")
        kernel_call(f"create netns {name}",
                    lambda: pr_netns.attach(name, threading.get_native_id()))

    _on_fresh_thread(f"netns-new-{name}", make)


def remove_netns(name: str) -> bool:
    """Remove a namespace; False if it was already gone."""
    if name not in pr_netns.listnetns():
        return False
    try:
        pr_netns.remove(name)
    except OSError as exc:
        if exc.errno in GONE_ERRNOS:
            return False
        raise KernelError(exc.errno or errno.EIO, f"remove netns {name}") from exc
    return True


def with_netlink(netns: str | None, fn: Callable[[IPRoute], T]) -> T:
    """FN(ipr) with a netlink socket of NETNS (None: this thread's namespace), opened on
    a thread inside NETNS and closed after."""
    def body() -> T:
        with kernel_call(f"open netlink in {netns or 'this namespace'}", IPRoute) as ipr:
            return fn(ipr)

    return body() if netns is None else run_in_netns(netns, body)


def link_index(ifname: str, netns: str | None = None) -> int | None:
    found = with_netlink(netns, lambda ipr: kernel_call(
        f"lookup {ifname}", lambda: ipr.link_lookup(ifname=ifname)))
    return int(found[0]) if found else None


def list_links(netns: str | None = None) -> list[str]:
    links = with_netlink(netns, lambda ipr: kernel_call("list links", ipr.get_links))
    return [str(link.get_attr("IFLA_IFNAME")) for link in links]


def remove_link(ifname: str, netns: str | None = None) -> bool:
    """Delete a link; False if it (or its namespace) was already gone."""
    if netns is not None and netns not in pr_netns.listnetns():
        return False

    def delete(ipr: IPRoute) -> bool:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return False
        ipr.link("del", index=found[0])
        return True

    try:
        return with_netlink(netns, delete)
    except NetlinkError as exc:
        if exc.code in GONE_ERRNOS:
            return False
        raise KernelError(int(exc.code), f"delete link {ifname}") from exc
    except KernelError as exc:
        if exc.errno in GONE_ERRNOS:  # the namespace went between the check and setns
            return False
        raise


def open_tun(ifname: str) -> int:
    """Create a TUN device (IFF_TUN|IFF_NO_PI) in the calling thread's namespace; returns
    its fd.

    The device lives as long as the fd is open (non-persistent); the fd is non-blocking.
    """
    if len(ifname) > 15:
        raise ValueError(f"ifname: at most 15 characters, got {ifname!r}")
    try:
        fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KernelError(exc.errno or errno.EIO, f"open {TUN_PATH}") from exc
    try:
        ifr = struct.pack("16sH", ifname.encode(), _IFF_TUN | _IFF_NO_PI)
        fcntl.ioctl(fd, _TUNSETIFF, ifr)
    except OSError as exc:
        os.close(fd)
        raise KernelError(exc.errno or errno.EIO, f"TUNSETIFF {ifname}") from exc
    return fd


def set_link_up(ifname: str, netns: str | None = None) -> None:
    """Bring IFNAME up (in NETNS, or in this process's namespace)."""
    def up(ipr: IPRoute) -> None:
        found = kernel_call(f"lookup {ifname}", lambda: ipr.link_lookup(ifname=ifname))
        if not found:
            raise KernelError(errno.ENODEV, f"set {ifname} up")
        kernel_call(f"set {ifname} up", lambda: ipr.link("set", index=found[0], state="up"))

    with_netlink(netns, up)


def open_host_tun(netns: str, ifname: str, address: str, *, mtu: int = 1500) -> int:
    """A TUN device IFNAME made inside NETNS as its host link (lo up, IFNAME up with
    ADDRESS/32 and 198.18.0.0/15 routed through it); returns its fd. One thread in NETNS
    does both: no move from the root namespace, one netlink socket (16 lanes set up 80
    of these at once, and each netlink socket costs the controller an event loop of
    pyroute2's)."""
    def body() -> int:
        fd = open_tun(ifname)
        try:
            with kernel_call(f"open netlink in {netns}", IPRoute) as ipr:
                _configure_host_link(ipr, netns, ifname, address, mtu)
        except BaseException:
            os.close(fd)
            raise
        return fd

    return run_in_netns(netns, body)


def _configure_host_link(ipr: IPRoute, netns: str, ifname: str, address: str, mtu: int
                         ) -> None:
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
    def body() -> T:
        try:
            pr_netns.setns(netns, flags=0)
        except OSError as exc:
            raise KernelError(exc.errno or errno.EIO, f"setns {netns}") from exc
        return fn()

    return _on_fresh_thread(f"netns-{netns}", body)


def _on_fresh_thread(name: str, fn: Callable[[], T]) -> T:
    """FN's result (or its exception) from a new thread that ends with it: a thread whose
    namespace FN changed is never reused."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def sysctl_path(key: str) -> Path:
    if not key.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"sysctl key: dotted name of letters/digits/_, got {key!r}")
    return Path("/proc/sys") / key.replace(".", "/")


HOST_NETNS_ENV = "TESTBED_HOST_NETNS"
"""Names the machine's own network namespace (a handle in /var/run/netns) for a process
that runs in another one: `testbed bench cluster` sets it for its lab hosts' workers."""


def write_root_sysctl(key: str, value: str) -> None:
    """Write a host-wide sysctl that only the machine's own network namespace may change
    (``net.ipv4.tcp_allowed_congestion_control``; elsewhere the kernel shows it
    read-only, EACCES). A process started in another namespace with ``HOST_NETNS_ENV``
    writes it from the namespace that names."""
    path = sysctl_path(key)
    host = os.environ.get(HOST_NETNS_ENV)
    if host and not _in_netns(host):
        run_in_netns(host, lambda: path.write_text(value))
    else:
        path.write_text(value)


def _in_netns(name: str) -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return False


def attach_netns(name: str) -> None:
    """Name this process's network namespace NAME (/var/run/netns/NAME, as `ip netns
    attach` does); `remove_netns` removes the name, not the namespace."""
    if name in pr_netns.listnetns():
        raise KernelError(errno.EEXIST, f"attach netns {name}")
    kernel_call(f"attach netns {name}", lambda: pr_netns.attach(name, os.getpid()))


def set_sysctl(netns: str, key: str, value: str) -> None:
    """Write a per-namespace sysctl, e.g. ("net.ipv4.tcp_congestion_control", "cubic")."""
    path = sysctl_path(key)

    def write() -> None:
        try:
            path.write_text(value)
        except OSError as exc:
            raise KernelError(exc.errno or errno.EIO, f"{netns}: sysctl {key}={value}") from exc

    run_in_netns(netns, write)


def disable_ipv6(netns: str) -> None:
    """No IPv6 in NETNS, on its devices now and later (the testbed is IPv4 only; router
    solicitations and MLD reports would count as link traffic). A no-op on a kernel
    without IPv6."""
    for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
        if sysctl_path(key).exists():
            set_sysctl(netns, key, "1")


def get_sysctl(netns: str | None, key: str) -> str:
    path = sysctl_path(key)
    if netns is None:
        return path.read_text().strip()
    return run_in_netns(netns, lambda: path.read_text().strip())



def socket_in_netns(
    netns: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
) -> socket.socket:
    """A socket that belongs to NETNS (sockets keep the namespace they were created in)."""
    if netns is None:
        return socket.socket(family, kind)
    return run_in_netns(netns, lambda: socket.socket(family, kind))
