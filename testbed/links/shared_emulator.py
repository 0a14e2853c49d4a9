"""One emulator process for every topology of this process (many lanes, one loop).

Rules:

1. ``SharedEmulator.acquire()`` returns this process's shared emulator, starting it if
   none runs (``python -m testbed.links.emulator --service-fd N``); ``release()``
   stops it when the last topology using it is gone. Its pid is recorded in a ledger of
   its own before anything is sent to it (``testbed clean`` stops it after a crash; a
   topology's teardown never does).
2. ``attach(tun_fds)`` hands the child a new control socket and a group's TUN fds in
   one SCM_RIGHTS message on the service socket, and returns this side's control
   socket: from there on the group is driven exactly as a private emulator is
   (``testbed.links.userspace.EmulatorHandle``); closing it ends the group in the child.
3. Everything here is thread-safe and blocking (short calls: call it through
   ``trio.to_thread.run_sync``): lanes of a dask worker run in different threads, each
   with a trio loop of its own, and share one emulator.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence

import msgpack

from testbed.errors import LinkFailure
from testbed.host.ledger import Ledger, new_prefix


class SharedEmulatorError(LinkFailure):
    """The shared emulator process is gone or refused a group."""


class SharedEmulator:
    """The process-wide shared emulator (see the module rules)."""

    _lock = threading.Lock()
    _current: SharedEmulator | None = None

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ledger = Ledger(new_prefix())
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "testbed.links.emulator", "--service-fd",
                 str(child.fileno())], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.ledger.record_process(self.process.pid)
        self.service = parent
        self.users = 0
        self.groups = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @classmethod
    def acquire(cls) -> SharedEmulator:
        with cls._lock:
            if cls._current is None or cls._current.returncode is not None:
                cls._current = cls()
            cls._current.users += 1
            return cls._current

    def attach(self, tun_fds: Sequence[int]) -> socket.socket:
        """A new group with these TUN fds; this side's control socket for it."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            body = msgpack.packb({"fds": list(tun_fds)})
            with self._lock:
                if self.returncode is not None:
                    raise SharedEmulatorError(f"shared emulator {self.pid} exited "
                                              f"(status {self.returncode})")
                socket.send_fds(self.service, [body], [theirs.fileno(), *tun_fds])
                self.groups += 1
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    def release(self) -> None:
        """One topology is done with it; the last one stops the process."""
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            if SharedEmulator._current is self:
                SharedEmulator._current = None
        self.service.close()  # EOF: the child stops
        try:
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.ledger.teardown()
