"""SIGTERM for topologies: cancel every live one so that each cleans up.

SIGINT already reaches trio as KeyboardInterrupt; SIGTERM must too, because a process
started in the background by a non-interactive shell ignores SIGINT.

The handler belongs to the process that installed it. pyroute2 forks short-lived
children (a socket made inside a namespace, its fd sent back) and stops them with
SIGTERM; a child inherits the handler, and calling into the parent's trio run there
blocks on locks other threads held at the fork, so the child never exits and the
parent waits for it forever (seen once in a 320-episode campaign). In any other
process the handler therefore does what SIGTERM does by default: exit at once.

Where the command line makes SIGTERM reach trio as KeyboardInterrupt, as Ctrl-C does
(``testbed run``, ``testbed exec``: ``testbed.interrupts.owns_sigterm``), no handler is
installed here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import trio

from testbed.interrupts import owns_sigterm


class _SigtermScopes:
    """The cancel scopes of every live topology of this process (several with
    ``testbed run --jobs N``). One SIGTERM handler serves them all: it is installed when
    the first topology opens and the previous handler is restored when the last closes,
    so topologies that open and close out of order never leave a stale handler behind."""

    def __init__(self) -> None:
        self.scopes: dict[int, tuple[trio.lowlevel.TrioToken, trio.CancelScope]] = {}
        self.previous: Any = None
        self.owner_pid = os.getpid()

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.owner_pid:  # a forked child (module docstring)
            os._exit(128 + signum)
        for token, scope in list(self.scopes.values()):
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

    def add(self, scope: trio.CancelScope) -> None:
        if not self.scopes:
            self.owner_pid = os.getpid()
            self.previous = signal.signal(signal.SIGTERM, self.on_sigterm)
        self.scopes[id(scope)] = (trio.lowlevel.current_trio_token(), scope)

    def remove(self, scope: trio.CancelScope) -> None:
        self.scopes.pop(id(scope), None)
        if not self.scopes:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


_SIGTERM_SCOPES = _SigtermScopes()


@contextlib.contextmanager
def cancel_on_sigterm(scope: trio.CancelScope) -> Iterator[None]:
    """On SIGTERM cancel SCOPE (then `open_topology` cleans up and raises KeyboardInterrupt).

    SIGINT already reaches trio as KeyboardInterrupt; SIGTERM must too, because a process
    started in the background by a non-interactive shell ignores SIGINT. Cancelling through
    the trio token is safe at any point, unlike raising from the signal handler.
    """
    if threading.current_thread() is not threading.main_thread() or owns_sigterm():
        yield  # (owns_sigterm: SIGTERM reaches trio as Ctrl-C does, testbed.interrupts)
        return
    _SIGTERM_SCOPES.add(scope)
    try:
        yield
    finally:
        _SIGTERM_SCOPES.remove(scope)
