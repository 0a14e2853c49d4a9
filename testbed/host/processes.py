"""Processes a run started, identified by pid *and* start time (a pid is reused)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import trio


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onward), None if
    gone. The name is cut at its last ')' because it may hold spaces and parentheses."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of PID in clock ticks (field 22 of /proc/PID/stat), None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def cpu_seconds(pid: int) -> float | None:
    """CPU time PID has used, user and system, all threads (fields 14 and 15 of
    /proc/PID/stat), None if gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def same_process(pid: int, start_ticks: int | None) -> bool:
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)


def stop_process(pid: int, start_ticks: int | None, *, grace_s: float = 2.0) -> bool:
    """SIGTERM then SIGKILL one recorded process, only if it is still the same process."""
    if not same_process(pid, start_ticks):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not same_process(pid, start_ticks) or _is_zombie(pid):
            _reap(pid)
            return True
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def is_running(pid: int, start_ticks: int | None) -> bool:
    """The recorded process still runs (a zombie has exited: only its reaping is left,
    which is its parent's business, init's once it was re-parented)."""
    return same_process(pid, start_ticks) and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


async def end_child(process: trio.Process, grace_s: float) -> None:
    """Stop a child this process started: SIGTERM, GRACE_S to exit, then SIGKILL; waits
    for it either way (shielded: it runs in ``finally`` blocks of cancelled scopes)."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(grace_s):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
