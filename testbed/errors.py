"""Whose fault it was: the testbed's error tree.

- :class:`UserError`: the input is wrong (a campaign field, a flag, a path). The
  message is one line naming the field and what is allowed. ``testbed`` exits 2.
- :class:`HostError`: this machine lacks something the run needs (root, a TUN device,
  a qdisc, a congestion control). The message says what is missing and how to get it;
  kernel refusals keep their errno (:class:`testbed.host.kernel.KernelError`).
  ``testbed`` exits 3.
- :class:`RunFailure`: a component of a live run failed (a node process died, the
  emulator exited). The campaign loop records the episode as aborted; outside a
  campaign it is shown with its traceback like any other bug.
- Anything else is a bug in the testbed and shows its traceback (exit 1).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user; one line naming the field and the allowed values."""


class HostError(Exception):
    """This host cannot do what was asked; one line saying what is missing and how to
    get it."""


class RunFailure(Exception):
    """A process or link of a live run failed (aborts the episode, not the campaign)."""


class LinkFailure(RunFailure):
    """The link emulation itself failed (the emulator process, not a node): the testbed's
    failure, so the unit records it as one (testbed.run.failures)."""


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (its type name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
