"""The stand-in model server as a child process (``testbed model-server``), for benchmarks,
tests and demos: a real server on a real socket, started on a free port and stopped (by
its pid: SIGTERM, then SIGKILL) when the block ends.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from testbed.errors import HostError
from testbed.host.processes import end_child

STARTUP_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
_URL = re.compile(rb" on (http://\S+/v1)")


@asynccontextmanager
async def open_stand_in(*args: str) -> AsyncIterator[str]:
    """Start ``testbed model-server --port 0 ARGS...``; yields its base URL (``.../v1``)."""
    async with open_stand_in_process(*args) as (url, _):
        yield url


@asynccontextmanager
async def open_stand_in_process(*args: str) -> AsyncIterator[tuple[str, trio.Process]]:
    """:func:`open_stand_in`, also yielding the child (to kill it mid-run in a test)."""
    cmd = [sys.executable, "-m", "testbed", "model-server", "--port", "0", *args]
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL,
                                               stdin=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        line = b""
        with trio.move_on_after(STARTUP_TIMEOUT_S):
            while b"\n" not in line:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                line += chunk
        found = _URL.search(line)
        if found is None:
            raise HostError(f"the stand-in model server did not start ({cmd!r} printed "
                            f"{line[:200]!r})")
        yield found.group(1).decode(), process
    finally:
        await end_child(process, STOP_GRACE_S)
        with trio.CancelScope(shield=True):
            if process.stdout is not None:
                await process.stdout.aclose()
