"""tests/leftovers.py counts only what the test's own runs created: a run of this process
left behind is found, a run of another process beside it never is; and its watch never
closes a descriptor that its reader thread may still read."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.host import kernel
from testbed.host.ledger import Ledger, new_prefix
from tests import leftovers
from tests.leftovers import watch_runs

FOREIGN = """
import os, sys, time
from testbed.host import kernel
from testbed.host.ledger import Ledger
parent = os.getpid()
if os.fork():
    os._exit(0)  # the grandchild is reparented: no descendant of the test
while os.getppid() == parent:  # not yet: on a busy host the exit can come after our ledger
    time.sleep(0.01)
os.setsid()
ledger = Ledger(sys.argv[1])
ledger.record_netns(sys.argv[1] + "-x")
kernel.create_netns(sys.argv[1] + "-x")
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(60)
"""


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")


@pytest.mark.privileged
def test_a_run_of_this_process_that_is_left_behind_is_found(tmp_path: Path) -> None:
    _root()
    prefix = new_prefix()
    with watch_runs() as runs:
        ledger = Ledger(prefix)
        ledger.record_netns(f"{prefix}-a")
        kernel.create_netns(f"{prefix}-a")
        directory = ledger.new_tmpdir("planfence", tmp_path)
    try:
        assert runs.prefixes == {prefix}
        assert runs.leftovers() == {f"netns {prefix}-a", f"ledger {prefix}.json",
                                    f"directory {directory}"}
    finally:
        ledger.teardown()
    assert runs.leftovers() == set()


@pytest.mark.privileged
def test_a_run_of_another_process_beside_is_never_counted(tmp_path: Path) -> None:
    _root()
    prefix = new_prefix()
    pid_file = tmp_path / "pid"
    with watch_runs() as runs:
        subprocess.run([sys.executable, "-c", FOREIGN, prefix, str(pid_file)], check=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the foreign run did not start"
            time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        assert f"{prefix}-x" in kernel.list_netns()  # it is there, beside us
        assert prefix in runs.foreign
        assert runs.prefixes == set()
        assert runs.leftovers() == set()
    finally:
        os.kill(pid, 9)
        Ledger.load(Ledger(prefix).path).teardown()


def _inotify_fds() -> set[int]:
    found = set()
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{entry}") == "anon_inode:inotify":
                found.add(int(entry))
    return found


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _runs_function(thread: threading.Thread, name: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


def test_the_watch_never_closes_a_descriptor_its_reader_may_still_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader is kept busy (in ``RunWatch.note``) past any timeout of the watch's
    join, as on a loaded host, and a pipe opened after the watch gets the number of its
    inotify descriptor: the pipe's data must stay the pipe's. The watch used to close the
    descriptor after a 5 s join whether or not the reader had ended, and the reader, still
    running, read the next test's pipe (an empty payload in a test run as nobody)."""
    monkeypatch.setattr(leftovers, "_state_dirs", lambda: [tmp_path])  # no root needed
    real_join = threading.Thread.join
    busy = threading.Lock()  # held: the reader cannot finish noting its event
    busy.acquire()

    def let_go() -> None:
        with contextlib.suppress(RuntimeError):  # released already
            busy.release()

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        if self.name != "leftovers-watch":
            real_join(self, timeout)
        elif timeout is None:  # waits as long as the reader runs: it may go on
            let_go()
            real_join(self)
        else:  # a loaded host: the timeout passes with the reader still busy
            real_join(self, min(timeout, 0.05))

    monkeypatch.setattr(threading.Thread, "join", join)
    before = _inotify_fds()
    payload = b"the next test's output"
    try:
        with watch_runs() as runs:
            (inotify_fd,) = _inotify_fds() - before
            reader = next(t for t in threading.enumerate() if t.name == "leftovers-watch")
            real_note = runs.note

            def busy_note(path: Path) -> None:
                with busy:
                    real_note(path)

            monkeypatch.setattr(runs, "note", busy_note)
            (tmp_path / "tb-busy.json").write_text("{}")
            deadline = time.monotonic() + 60
            while not _runs_function(reader, "busy_note"):
                assert time.monotonic() < deadline, "the reader never took the event"
                time.sleep(0.01)
        alive_after_the_watch = reader.is_alive()
        assert not _is_open(inotify_fd), "the watch left its inotify descriptor open"
        read_end, write_end = os.pipe()
        if read_end != inotify_fd:  # the number is free (above): the pipe takes it
            os.dup2(read_end, inotify_fd)
            os.close(read_end)
            read_end = inotify_fd
        try:
            os.write(write_end, payload)
            os.set_blocking(read_end, False)
            let_go()  # a reader that still runs goes on now
            real_join(reader, 60)
            assert not reader.is_alive()
            left = b""
            with contextlib.suppress(BlockingIOError):
                left = os.read(read_end, 1024)
        finally:
            os.close(read_end)
            os.close(write_end)
    finally:
        let_go()
    assert left == payload, "the watch's reader read a pipe opened after the watch ended"
    assert not alive_after_the_watch, "the watch ended before its reader did"
