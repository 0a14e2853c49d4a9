"""Interrupts of a command: Ctrl-C and SIGTERM end it once, cleanly, with one line.

Rules this module obeys:

1. ``testbed run`` and ``testbed exec`` call :func:`handled` around the command
   (``testbed.cli.main``), which puts Python's own SIGINT handler back first (a
   library may have left one that, say, exits; trio then steps aside). While it holds, SIGTERM does what Ctrl-C does: the first
   SIGINT or SIGTERM is a ``KeyboardInterrupt``, delivered by trio's own SIGINT handler
   inside a trio run (at a checkpoint where trio protects its own code, as Ctrl-C
   always was) and raised at once outside one. The ``finally`` blocks remove what the
   command built, as on any error, and ``main`` ends with one line and exit status
   128 + the signal (130 for SIGINT, 143 for SIGTERM).
2. Inside a trio run :func:`guard` puts this module's handler in front of trio's (trio
   installs its own only when SIGINT has Python's default handler, so the wrapping
   happens inside the run). After the first signal every later SIGINT or SIGTERM
   prints one line saying the command is still cleaning up and is otherwise ignored,
   until the command ends: a second Ctrl-C never cuts the cleanup short (to abandon it:
   ``kill -9``, then ``testbed clean``). Once the command has said it was interrupted,
   both are ignored while the process exits.
3. A SIGINT this process was started ignoring (a background job of a non-interactive
   shell) stays ignored, and trio has then no handler to deliver SIGTERM with: the
   guard cancels its body instead (through the run's token, safe at any point, as
   ``testbed.net.signals`` cancels a topology) and raises ``KeyboardInterrupt`` in
   place of what the cancelled body raised. (Slower to unwind than a delivered
   interrupt: everything is cancelled at once, so a team waits out its shutdown grace
   for nodes whose end the cancelled zygote can no longer report. A live topology
   therefore keeps its own SIGTERM handler here, rule 4, and cancels only itself.)
4. Outside :func:`handled` nothing changes: a library user's SIGINT is trio's, and a
   live topology turns SIGTERM into cancellation itself (``testbed.net.signals``, which
   stands aside where SIGTERM reaches trio as Ctrl-C does, :func:`owns_sigterm`).
5. The handlers belong to the process that installed them; in a forked child (pyroute2
   forks children and stops them with SIGTERM) a signal ends the child at once, as
   ``testbed.net.signals`` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import trio

STILL_CLEANING = ("testbed: still cleaning up (stopping what it started, removing what it "
                  "built); wait for it, or kill -9 it and run `testbed clean`\n")

Handler = Callable[[int, FrameType | None], Any]


class Interrupted(KeyboardInterrupt):
    """A command's own line for its interruption (``testbed: interrupted; DETAIL``)."""

    def __init__(self, detail: str, signum: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.signum = signum


class _State:
    def __init__(self) -> None:
        self.owner = 0  # the pid that installed the handlers (0: not installed)
        self.first: int | None = None  # the first signal received
        self.sigint = True  # SIGINT is ours to handle (rule 3)
        self.deliver: Handler | None = None  # trio's SIGINT handler, inside guard()
        self.cancel: Callable[[], None] | None = None  # cancels the guarded body (rule 3)
        self.previous: dict[int, Any] = {}


_STATE = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _STATE.owner:  # a forked child (rule 5)
        os._exit(128 + signum)
    if signum == signal.SIGINT and not _STATE.sigint:
        return  # ignored, as the process was started (rule 3)
    if _STATE.first is not None:
        os.write(2, STILL_CLEANING.encode())
        return
    _STATE.first = signum
    current = signal.getsignal(signal.SIGINT)
    if _STATE.sigint:
        signal.signal(signal.SIGINT, _handler)  # from now on: "still cleaning up"
    if _STATE.deliver is not None:
        _STATE.deliver(signal.SIGINT, frame)  # trio's: KeyboardInterrupt where it may be
    elif _STATE.cancel is not None:
        _STATE.cancel()
    elif callable(current) and current is not _handler:  # a trio run without a guard
        current(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def owns_sigterm() -> bool:
    """Whether SIGTERM reaches trio as Ctrl-C does in this process (rule 1), so that
    ``testbed.net.signals`` leaves it alone. Not where SIGINT is ignored (rule 3): a live
    topology then cancels itself, as it always did, which unwinds faster than the
    guard's cancel of everything."""
    return _STATE.owner == os.getpid() and _STATE.sigint \
        and signal.getsignal(signal.SIGTERM) is _handler


def received() -> int | None:
    """The first SIGINT or SIGTERM received while :func:`handled` held, if any."""
    return _STATE.first


@contextlib.contextmanager
def handled(enabled: bool = True) -> Iterator[None]:
    """Rules 1-3 for the command run inside the block (a no-op unless ``enabled``, or
    off the main thread)."""
    if not enabled or threading.current_thread() is not threading.main_thread() \
            or _STATE.owner == os.getpid():
        yield
        return
    _STATE.owner, _STATE.first, _STATE.deliver, _STATE.cancel = os.getpid(), None, None, None
    _STATE.sigint = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    _STATE.previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _handler),
                       signal.SIGINT: signal.getsignal(signal.SIGINT)}
    if _STATE.sigint:  # Python's own, whatever a library left: trio then installs its own
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, previous in _STATE.previous.items():
            if _STATE.first is not None:  # interrupted, and said so: exiting (rule 2)
                previous = signal.SIG_IGN
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        _STATE.owner, _STATE.first, _STATE.previous = 0, None, {}
        _STATE.deliver = _STATE.cancel = None


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Rules 2-3 for a trio run's body (in its main task); a no-op outside
    :func:`handled`."""
    if _STATE.owner != os.getpid() or threading.current_thread() is not threading.main_thread():
        yield
        return
    current = signal.getsignal(signal.SIGINT)
    trio_handler: Handler | None = current if callable(current) and current is not _handler \
        else None
    token = trio.lowlevel.current_trio_token()
    try:
        with trio.CancelScope() as scope:

            def cancel() -> None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(scope.cancel)

            if trio_handler is not None:
                _STATE.deliver = trio_handler
                signal.signal(signal.SIGINT, _handler)
            else:  # SIGINT ignored: trio installed no handler (rule 3)
                _STATE.cancel = cancel
            try:
                yield
            finally:
                _STATE.deliver = _STATE.cancel = None
                if trio_handler is not None and _STATE.first is None:
                    signal.signal(signal.SIGINT, trio_handler)  # trio restores the default
    except BaseException as exc:
        if scope.cancel_called and _STATE.first is not None:  # what our cancel caused
            raise KeyboardInterrupt from exc
        raise
    if scope.cancel_called and _STATE.first is not None:
        raise KeyboardInterrupt


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is an interruption: a ``KeyboardInterrupt``, or an exception
    group (trio's nurseries wrap what ends them) holding one, whatever else it holds
    (the ``Cancelled`` of the tasks it stopped, errors of programs it killed)."""
    return any(isinstance(leaf, KeyboardInterrupt) for leaf in _leaves(exc))


def signal_of(exc: BaseException) -> int:
    """The signal that interrupted: the first received, else SIGTERM when a topology
    turned it into its ``KeyboardInterrupt`` (``testbed.net.topology``), else SIGINT."""
    if isinstance(exc, Interrupted):
        return exc.signum
    if _STATE.first is not None:
        return _STATE.first
    if any(isinstance(leaf, KeyboardInterrupt) and str(leaf).startswith("SIGTERM")
           for leaf in _leaves(exc)):
        return int(signal.SIGTERM)
    return int(signal.SIGINT)
