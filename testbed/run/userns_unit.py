"""Work in a user namespace of its own: how a worker without root runs shaped units.

Rules:

1. A dask worker process has threads, and the kernel gives a user namespace only to a
   single-threaded process (``testbed.host.userns`` rule 3). So a worker that is not
   root runs each shaped unit in a fresh child, ``python -m testbed.run.userns_unit``,
   which enters a user, mount and network namespace first thing, before anything
   starts a thread, and there runs the unit whole, as a root worker runs it in its
   own process (its topology, TUN devices and node processes then belong to that user
   namespace, and the kernel frees them with it, whatever happens to the child).
2. The child is told what to call by name (``"module:function"``) and its argument,
   pickled on its stdin; the answer comes back pickled on its stdout (a value, or the
   exception it raised); its stderr is the worker's.
3. Cancelling: ``cancelled()`` is polled while the child runs; once it says so the
   child gets SIGTERM, and the called function is expected to stop cleanly on it (its
   topologies cancel themselves on SIGTERM, ``testbed.net.signals``). The child also
   asks the kernel for SIGTERM if its parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import importlib
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from testbed.errors import RunFailure

POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


class ChildFailed(RunFailure):
    """The user-namespace child ended without an answer (it was killed, or crashed)."""


def call_in_user_namespace(target: str, arg: Any, *,
                           cancelled: Callable[[], bool] = lambda: False) -> Any:
    """``module:function(arg)`` in a fresh child inside a user namespace (rules 1-3)."""
    proc = subprocess.Popen([sys.executable, "-m", "testbed.run.userns_unit"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    request: bytes | None = pickle.dumps((target, arg))
    out = b""
    terminated = False
    try:
        while True:
            try:
                out, _ = proc.communicate(request, timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                request = None  # sent already; communicate keeps collecting the output
                if not terminated and cancelled():
                    proc.terminate()
                    terminated = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not out:
        raise ChildFailed(f"{target}: the user-namespace child exited with status "
                          f"{proc.returncode} and no answer")
    status, value = pickle.loads(out)
    if status == "error":
        raise value
    return value


def _main() -> int:
    from testbed.host.userns import enter_user_namespace

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    try:
        enter_user_namespace()  # first: still one thread (rule 1)
        target, arg = pickle.load(sys.stdin.buffer)
        module, _, name = target.partition(":")
        answer: tuple[str, Any] = ("ok", getattr(importlib.import_module(module), name)(arg))
    except Exception as exc:
        answer = ("error", exc)
    try:
        data = pickle.dumps(answer)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        data = pickle.dumps(("error", RunFailure(f"{answer[1]!r} (unpicklable: {exc})")))
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
