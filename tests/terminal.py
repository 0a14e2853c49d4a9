"""Signals as a terminal gives them: a command a test starts gets Ctrl-C's default
disposition whatever this process inherited (a background job of a non-interactive
shell, or a pytest-xdist worker, starts with SIGINT ignored, and children inherit that:
an interrupt test would then test nothing)."""

from __future__ import annotations

import signal


def sigint_as_from_a_terminal() -> None:
    """A ``preexec_fn``: SIGINT back to its default disposition in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
