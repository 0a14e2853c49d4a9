"""The SIGTERM handler of live topologies, in the process that installed it and in its
forked children (pyroute2 forks children and stops them with SIGTERM)."""

from __future__ import annotations

import os
import signal
import time

import trio

from testbed.net.signals import cancel_on_sigterm


def _fork_and_terminate_child() -> int:
    """Fork (from a worker thread, as pyroute2 does), SIGTERM the child; its status."""
    pid = os.fork()
    if pid == 0:  # the child: it should die of the signal, not carry on
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(3)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child did not exit within 10 s")


async def test_a_forked_child_exits_on_sigterm_and_the_owner_is_cancelled() -> None:
    with trio.CancelScope() as scope, cancel_on_sigterm(scope):
        status = await trio.to_thread.run_sync(_fork_and_terminate_child)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
        assert not scope.cancel_called  # the child's signal never reached this run
        os.kill(os.getpid(), signal.SIGTERM)  # the owner's does
        await trio.sleep(5)
    assert scope.cancelled_caught
