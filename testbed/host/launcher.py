"""Run one user command inside a host's namespaces so that nothing it starts outlives it.

The controller starts this file as a program (``python -I -S launcher.py``: standard
library only, no project import, so it starts in a few tens of milliseconds)::

    launcher.py [--netns NAME] [--hosts-file PATH] [--hostname NAME] [--watch-pid PID]
                [--grace-s S] -- COMMAND ARG...

Rules:

1. The launcher (L) enters the host's network namespace (``setns`` on
   /var/run/netns/NAME), unshares a mount and a UTS namespace (mounts made private
   recursively, so nothing propagates back to the host), bind-mounts the run's hosts
   file on /etc/hosts (host names resolve without DNS), mounts the namespace's own
   sysfs on /sys and sets the host name; then it unshares a PID namespace.
2. Its one child (I) is PID 1 of that PID namespace: it mounts a fresh /proc, starts
   the command (C) as its child and reaps every process of the namespace. When C
   exits, I asks whatever C left behind to stop (SIGTERM), waits at most ``grace_s``
   and exits with C's status; the kernel kills every process still in a PID namespace
   whose init has exited, so nothing C started can outlive it.
3. SIGTERM to L stops everything: I sends SIGTERM to every process of the namespace and
   exits after ``grace_s`` at the latest. SIGINT, SIGHUP and SIGQUIT are passed on to C.
   I dies with L (``PR_SET_PDEATHSIG``, and a pipe from L whose end-of-file I watches,
   which also covers L dying before the death signal was armed).
4. L watches the controller (``--watch-pid``, through a pidfd): when the controller is
   gone (killed with SIGKILL), L stops I as on SIGTERM. ``testbed clean`` stops L by
   its recorded pid and start time.
5. Exit status: C's (128 + N when a signal N ended it); 125 when the launcher could not
   set up (a one-line reason on stderr), 126 when the command cannot run, 127 when it
   does not exist, like env(1) and timeout(1).
6. I signals "every process" (``kill(-1)``) only as PID 1 of its own PID namespace, and
   refuses to start otherwise: outside one, kill(-1) by root reaches every process of
   the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
NETNS_DIR = "/var/run/netns"
EXIT_SETUP, EXIT_CANNOT_RUN, EXIT_NOT_FOUND = 125, 126, 127
PASSED_ON = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The launcher could not prepare the namespaces (exit 125, one line)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise SetupError(f"{what}: [{errno.errorcode.get(code, '?')}] {os.strerror(code)}")


def _mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(source.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), flags, None),
           f"mount {fstype or source} on {target}")


def enter_host(netns: str | None, hosts_file: str | None, hostname: str | None) -> None:
    """Rule 1, up to the PID namespace (no NETNS: stay in this network namespace, as the
    hosts of an unshaped network do)."""
    if netns is not None:
        fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
        finally:
            os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare mount and UTS namespaces")
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    if hosts_file is not None:
        _mount(hosts_file, "/etc/hosts", None, MS_BIND)
    if netns is not None:
        _check(_libc.umount2(b"/sys", MNT_DETACH), "unmount /sys")
        _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if hostname is not None:
        name = hostname.encode()
        _check(_libc.sethostname(name, len(name)), f"set host name {hostname}")
    _check(_libc.unshare(CLONE_NEWPID), "unshare PID namespace")


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def _signals(read_fd: int) -> list[int]:
    try:
        return list(os.read(read_fd, 512))
    except BlockingIOError:
        return []


def _wakeup_pipe(signums: tuple[int, ...]) -> int:
    """Signals arrive as bytes on a pipe (select() then sees them); returns its read end."""
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    for signum in signums:
        signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    return read_fd


def _exec_command(argv: list[str], report_fd: int) -> None:
    """In C: default signal dispositions, then exec; a failure is reported on REPORT_FD."""
    signal.set_wakeup_fd(-1)
    for signum in range(1, signal.NSIG):
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(report_fd, f"{exc.errno}".encode())
    os._exit(EXIT_NOT_FOUND)


def _signal_namespace(signum: int) -> None:
    """Send SIGNUM to every other process of this PID namespace. Only PID 1 of a
    namespace of its own may: anywhere else kill(-1) reaches every process the caller
    may signal, for root the whole machine (rule 6)."""
    if os.getpid() != 1:
        os._exit(EXIT_SETUP)
    os.kill(-1, signum)


def init_main(argv: list[str], grace_s: float, parent_fd: int) -> None:
    """I, PID 1 of the host's PID namespace (rule 2); never returns."""
    if os.getpid() != 1:  # the PID namespace is missing: refuse (rule 6)
        print("testbed launcher: not PID 1 of a PID namespace of its own; refusing to run",
              file=sys.stderr)
        os._exit(EXIT_SETUP)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError as exc:
        print(f"testbed launcher: {exc}", file=sys.stderr)
        os._exit(EXIT_SETUP)
    wake = _wakeup_pipe((signal.SIGCHLD, signal.SIGTERM, *PASSED_ON))
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        os.close(report_r)
        _exec_command(argv, report_w)
    os.close(report_w)
    failure = os.read(report_r, 64)
    os.close(report_r)
    status: int | None = None
    if failure:
        code = int(failure)
        print(f"testbed: {argv[0]}: {os.strerror(code)}", file=sys.stderr)
        status = EXIT_NOT_FOUND if code == errno.ENOENT else EXIT_CANNOT_RUN
    stop_at: float | None = None
    while True:
        while True:  # reap every exited process of the namespace
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(status if status is not None else EXIT_SETUP)  # nobody left
            if pid == 0:
                break
            if pid == child and status is None:
                status = _status(wait_status)
        if status is not None and stop_at is None:
            _signal_namespace(signal.SIGTERM)  # what C left behind
            stop_at = time.monotonic() + grace_s
        if stop_at is not None and time.monotonic() >= stop_at:
            os._exit(status if status is not None else 128 + signal.SIGTERM)
        timeout = None if stop_at is None else max(0.0, stop_at - time.monotonic())
        ready, _, _ = select.select([wake, parent_fd], [], [], timeout)
        stop = False
        if parent_fd in ready:
            stop = True  # L is gone (rule 3)
        for signum in _signals(wake) if wake in ready else []:
            if signum == signal.SIGTERM:
                stop = True
            elif signum in PASSED_ON and status is None:
                os.kill(child, signum)
        if stop and stop_at is None:
            _signal_namespace(signal.SIGTERM)
            stop_at = time.monotonic() + grace_s


def launcher_main(args: argparse.Namespace) -> int:
    """L (rules 1, 3, 4): prepare, start I, pass signals on, return I's status."""
    try:
        enter_host(args.netns, args.hosts_file, args.hostname)
    except (SetupError, OSError) as exc:
        print(f"testbed launcher: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        watch = os.pidfd_open(args.watch_pid) if args.watch_pid else None
    except ProcessLookupError:
        print("testbed launcher: the controller is gone", file=sys.stderr)
        return EXIT_SETUP
    wake = _wakeup_pipe((signal.SIGCHLD, signal.SIGTERM, *PASSED_ON))
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        if watch is not None:
            os.close(watch)
        init_main(args.command, args.grace_s, alive_r)
    os.close(alive_r)
    watched = [wake] + ([watch] if watch is not None else [])
    while True:
        pid, wait_status = os.waitpid(init, os.WNOHANG)
        if pid == init:
            return _status(wait_status)
        ready, _, _ = select.select(watched, [], [])
        if watch is not None and watch in ready:
            os.kill(init, signal.SIGTERM)  # the controller is gone (rule 4)
            watched.remove(watch)
        for signum in _signals(wake) if wake in ready else []:
            if signum != signal.SIGCHLD:
                os.kill(init, signum)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="testbed-launcher")
    parser.add_argument("--netns")
    parser.add_argument("--hosts-file")
    parser.add_argument("--hostname")
    parser.add_argument("--watch-pid", type=int, default=0)
    parser.add_argument("--grace-s", type=float, default=2.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("give a command after --")
    return args


if __name__ == "__main__":
    sys.exit(launcher_main(parse_args(sys.argv[1:])))
