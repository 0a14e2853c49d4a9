"""Leftover checks that count only what the test's own runs created.

Other engineers' suites and campaigns share this host, so no check here looks at names
by pattern (``tb*`` namespaces, ``planfence-tb*`` directories). Every run records what
it creates in a ledger before it creates it (testbed.host.ledger), and a ledger names
its owner process. :func:`watch_runs` watches the run-state directories with inotify
(no ledger is missed, however short-lived) and keeps the ledgers whose owner is this
process or one of its descendants (a ``testbed run`` it started, a dask worker, a
``testbed worker``): those runs, and nothing else, are the test's own. What of theirs
still exists afterwards is a leftover: a namespace or link with their prefix, a
directory or process their ledgers recorded, a ledger file still there.

:func:`prefix_objects` serves a test that knows its run's prefix already.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import UserError
from testbed.host import kernel
from testbed.host import ledger as ledger_mod
from testbed.host.processes import same_process

_IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x8, 0x80, 0x100
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process PID is ANCESTOR or one of its descendants (now)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the command name
    return False


@dataclass
class RunWatch:
    """The ledgers of this process's runs seen while the watch was open."""

    root_pid: int = field(default_factory=os.getpid)
    prefixes: set[str] = field(default_factory=set)
    ledgers: set[Path] = field(default_factory=set)
    tmpdirs: set[str] = field(default_factory=set)
    processes: set[tuple[int, int | None]] = field(default_factory=set)
    foreign: set[str] = field(default_factory=set)  # prefixes of other processes' runs
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, path: Path) -> None:
        """A ledger file appeared or changed: take what it records, if it is ours."""
        with self.lock:
            self._note(path)

    def _note(self, path: Path) -> None:
        prefix = path.name.removesuffix(".json")
        if prefix in self.foreign:
            return
        try:
            ledger = ledger_mod.Ledger.load(path)
        except (OSError, ValueError, KeyError, TypeError, UserError):
            return  # gone already (torn down) or not a ledger
        if prefix not in self.prefixes:
            if not _descends_from(ledger.owner_pid, self.root_pid):
                self.foreign.add(prefix)
                return
            self.prefixes.add(prefix)
            self.ledgers.add(path)
        for entry in ledger.entries:
            if entry.get("kind") == "tmpdir":
                self.tmpdirs.add(str(entry["path"]))
            elif entry.get("kind") == "process":
                self.processes.add((int(entry["pid"]), entry.get("start_ticks")))

    def leftovers(self) -> set[str]:
        """What the watched runs created that still exists."""
        with self.lock:
            return self._leftovers()

    def _leftovers(self) -> set[str]:
        found = {f"ledger {p.name}" for p in self.ledgers if p.exists()}
        if self.prefixes:
            found |= {f"netns {n}" for n in kernel.list_netns()
                      if any(n.startswith(p) for p in self.prefixes)}
            found |= {f"link {n}" for n in kernel.list_links()
                      if any(n.startswith(p) for p in self.prefixes)}
        found |= {f"directory {d}" for d in self.tmpdirs if Path(d).exists()}
        found |= {f"process {pid}" for pid, ticks in self.processes
                  if same_process(pid, ticks)}
        return found

    def wait_clean(self, timeout_s: float = 15.0) -> set[str]:
        """Leftovers once they stopped shrinking or ``timeout_s`` passed (a worker or
        a killed node tears down a moment after its run returned)."""
        deadline = time.monotonic() + timeout_s
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def _state_dirs() -> list[Path]:
    dirs = {ledger_mod.STATE_DIR, ledger_mod.run_state_dir()}
    return sorted(d for d in dirs if os.geteuid() == 0 or d != ledger_mod.STATE_DIR)


def _events(data: bytes) -> Iterator[tuple[int, str]]:
    """(watch descriptor, file name) of each inotify event in DATA."""
    offset = 0
    while offset < len(data):
        wd, _mask, _cookie, size = _EVENT.unpack_from(data, offset)
        raw = data[offset + _EVENT.size: offset + _EVENT.size + size]
        offset += _EVENT.size + size
        yield wd, raw.split(b"\0", 1)[0].decode(errors="replace")


@contextlib.contextmanager
def watch_runs() -> Iterator[RunWatch]:
    """Watch the run-state directories while the block runs (module docstring).

    The reader thread waits on the inotify descriptor and on a stop pipe together; the
    block's end writes to the pipe, the reader takes every event still queued and ends,
    and only then are the descriptors closed. (It used to be stopped by a flag it polled
    every 50 ms and joined with a timeout, and the inotify descriptor was closed even
    when the reader had not ended on a loaded host: the next test's pipe got the same
    number and the reader, still running, read that test's output.)
    """
    watch = RunWatch()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    stop_r = stop_w = -1
    try:
        stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
        dirs: dict[int, Path] = {}
        for d in _state_dirs():
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            wd = libc.inotify_add_watch(fd, str(d).encode(),
                                        _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
            dirs[wd] = d
        failure: list[BaseException] = []

        def take_queued() -> None:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    return  # the queue is empty
                for wd, name in _events(data):
                    if name.startswith("tb") and name.endswith(".json") and wd in dirs:
                        watch.note(dirs[wd] / name)

        def read_events() -> None:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.register(stop_r, select.POLLIN)
                while True:
                    ready = {ready_fd for ready_fd, _ in poller.poll()}
                    take_queued()  # on a stop too: the block's last events
                    if stop_r in ready:
                        return
            except BaseException as exc:  # the block's end raises it (a watch that broke)
                failure.append(exc)

        reader = threading.Thread(target=read_events, name="leftovers-watch", daemon=True)
        reader.start()
        try:
            yield watch
        finally:
            os.write(stop_w, b"x")
            reader.join()  # no timeout: nothing below closes a descriptor it may still read
        if failure:
            raise failure[0]
    finally:
        for own in (fd, stop_r, stop_w):
            if own >= 0:
                os.close(own)


def prefix_objects(prefix: str) -> list[str]:
    """The namespaces, links and ledger state file of the run with ``prefix`` that still
    exist (a test that knows its run's prefix)."""
    found = [n for n in kernel.list_netns() if n.startswith(prefix)]
    found += [n for n in kernel.list_links() if n.startswith(prefix)]
    if (ledger_mod.STATE_DIR / f"{prefix}.json").exists():
        found.append("ledger state file")
    return found
