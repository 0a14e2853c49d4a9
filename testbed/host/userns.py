"""Rootless runs: the whole topology inside a user namespace the run creates.

Rules:

1. ``privilege()`` says how this process can build topologies: ``root`` (real root in
   the initial user namespace), ``userns`` (root inside a user namespace of its own) or
   ``user`` (neither: only loopback campaigns).
2. ``enter_user_namespace()`` turns an unprivileged process into ``userns``: it
   unshares a user, a mount and a network namespace at once, maps root to the caller's
   uid and gid, makes every mount private and mounts a fresh tmpfs on /run, so named
   network namespaces (/run/netns) and the run's ledger (/run/planfence-testbed) live
   in a mount namespace nobody else sees. The run's namespaces, TUN devices and
   processes are then children of that user namespace: when its last process exits
   the kernel frees them all, whatever happened to the run.
3. It must be called while the process has one thread (the kernel refuses a user
   namespace to a multithreaded process), before trio or anything else starts threads.
4. What a user namespace cannot do, and what the run does instead (recorded in the
   manifest as ``privilege = "userns"``):
   - the root namespace's ``tcp_allowed_congestion_control`` belongs to the host, so a
     restricted algorithm (cubic on most hosts) cannot become a namespace default:
     nodes set it on each of their sockets (TCP_CONGESTION), which the namespace's
     owner may do;
   - SCHED_FIFO needs the host's CAP_SYS_NICE: the emulator runs at normal priority,
     so its release lateness grows with the host's load (docs/emulator.md).
5. ``probe()`` checks all of this for real in a forked child (doctor's "rootless" row).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from pathlib import Path

from testbed.errors import HostError

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_INIT_MAP = "0 0 4294967295"
_PR_SET_DUMPABLE = 4


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def in_user_namespace() -> bool:
    """True unless this process is in the initial user namespace."""
    try:
        lines = Path("/proc/self/uid_map").read_text().split("\n")
    except OSError:
        return False
    return " ".join(lines[0].split()) != _INIT_MAP


def outer_uid() -> int:
    """This process's uid in the initial user namespace (its own uid outside one)."""
    try:
        first = Path("/proc/self/uid_map").read_text().split("\n")[0].split()
    except OSError:
        return os.getuid()
    if len(first) == 3 and first[0] == str(os.getuid()):
        return int(first[1])
    return os.getuid()


def privilege() -> str:
    """``root``, ``userns`` or ``user`` (rule 1)."""
    if os.geteuid() != 0:
        return "user"
    return "userns" if in_user_namespace() else "root"


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise HostError(f"rootless: {what} failed: [Errno {code} "
                        f"{errno.errorcode.get(code, '?')}] {os.strerror(code)}; this host "
                        "does not allow unprivileged user namespaces (see "
                        "/proc/sys/user/max_user_namespaces); run as root instead")


def enter_user_namespace() -> None:
    """Become root of a new user + mount + network namespace (rules 2 and 3)."""
    if privilege() != "user":
        return
    uid, gid = os.getuid(), os.getgid()
    libc = _libc()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(user, mount, net)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making mounts private")
    _check(libc.mount(b"tmpfs", b"/run", b"tmpfs", 0, b"mode=0755"), "mounting tmpfs on /run")
    var_run = Path("/var/run")
    if var_run.is_dir() and not var_run.is_symlink():
        _check(libc.mount(b"tmpfs", b"/var/run", b"tmpfs", 0, b"mode=0755"),
               "mounting tmpfs on /var/run")
    from testbed.host.kernel import set_link_up

    set_link_up("lo")


def probe() -> tuple[bool, str]:
    """Can this user run topologies in a user namespace? Tried in a forked child."""
    user = "nobody" if privilege() == "root" else f"uid {os.getuid()}"
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: try it all, report, exit without running cleanup handlers
        status = 1
        try:
            os.close(read_fd)
            report = _probe_child()
            os.write(write_fd, json.dumps(report).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    os.waitpid(pid, 0)
    if not payload:
        return False, "the probe child died"
    ok, detail = json.loads(payload)
    return bool(ok), f"{detail} (as {user})"


def _probe_child() -> tuple[bool, str]:
    from testbed.host import kernel

    try:
        if privilege() == "root":
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            # a credential change makes the process non-dumpable, which hands its
            # /proc/self files to root; an ordinary user's process is dumpable
            _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        enter_user_namespace()
        name = f"tbuns{os.getpid() % 100000}"
        kernel.create_netns(name)
        fd = kernel.run_in_netns(name, lambda: kernel.open_tun(f"{name}t"))
        os.close(fd)
    except (OSError, HostError) as exc:
        return False, str(exc)
    return True, ("user, mount and network namespaces, a named namespace and a TUN device "
                  "created unprivileged")
