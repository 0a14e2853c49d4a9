"""Failures contained to their unit: a campaign goes on when one unit fails.

Rules this module obeys (``testbed.run.units.run_unit`` applies them):

1. An episode's own abort (the runner raised ``EpisodeAborted``: a node died, froze or
   timed out) is a measurement and no failure. A *unit failure* is anything else: the
   unit's topology or team did not start, an episode raised another error (a kernel
   or emulator error, a bug), the group's background work failed while an episode
   ran, tearing the group down failed, or a cluster task raised on its worker
   (stage ``worker``, ``testbed.run.dask_engine``).
2. A group that does not start is opened again, up to :data:`START_ATTEMPTS` times in
   all (the node startup limit is measured again first, ``testbed.run.startup``).
   After the last attempt every pending episode of the unit is recorded as aborted
   with reason ``unit_failed: start: ...``. A ``UserError`` (the input is wrong) or a
   ``HostError`` that is no kernel call's errno (the host lacks a feature, e.g. a
   backend) is not contained: every unit would fail alike, so it ends the run with
   its one-line error, as it does before anything runs.
3. An error while an episode runs aborts that episode with reason
   ``unit_failed: run: ...``; the group is closed and the unit's next episode runs on
   a fresh one (as after any abort).
4. A teardown error leaves the episodes that finished as they were measured (the
   network they ran on was intact; only removing it failed). What could not be
   undone stays recorded in its ledger (``testbed.host.ledger``: an entry is dropped
   only once undone), so ``testbed clean`` removes it when the run has ended.
5. Every unit failure is reported as a :class:`UnitFailure` (plain data: it crosses
   process boundaries from a cluster worker); the campaign loop records each in the
   manifest (the session's ``failures``) with its traceback in the run directory's
   ``failures.log``, and ``testbed run`` ends with exit status 4 and a one-line
   summary when any lost episodes or left host state (a start that a retry overcame
   does not count). An error of the loop's own callbacks is the loop's, not the
   unit's (:class:`CallbackError`). Cancellation (Ctrl-C, a cluster's cancel) is never
   contained: ``trio.Cancelled`` and ``KeyboardInterrupt`` are no ``Exception``.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.campaign.model import Cell, GroupKey
from testbed.errors import HostError, UserError, one_line
from testbed.host.ledger import Ledger, open_run_ledger
from testbed.results.rundir import RunDir
from testbed.run.contract import Group, Runner, RunSummary

START_ATTEMPTS = 3
"""A unit's group is opened at most this many times in a row before its episodes are
aborted (rule 2)."""
UNIT_FAILED = "unit_failed"
STAGES = ("start", "run", "teardown", "worker")


@dataclass(frozen=True)
class UnitFailure:
    """One failure of a unit (rule 5): where it happened, why, and which episodes it
    aborted (none for a teardown or a start that a retry overcame)."""

    group: str
    stage: str  # one of STAGES
    reason: str
    aborted: tuple[str, ...] = ()
    attempt: int = 1
    worker: str = ""
    trace: str = ""  # the traceback, for the run's failures.log

    @property
    def retried(self) -> bool:
        """A start that failed and is tried again (no episode lost yet)."""
        return self.stage == "start" and not self.aborted

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "stage": self.stage, "reason": self.reason,
                "aborted": list(self.aborted), "attempt": self.attempt,
                "worker": self.worker}


class CallbackError(Exception):
    """An error of the campaign loop's own callbacks (committing an outcome) raised
    inside a unit: the loop's failure, never the unit's, so never contained."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class GroupEnd:
    """How one opening of a group ended: ``stage`` None when cleanly."""

    stage: str | None = None
    reason: str = ""
    trace: str = ""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def failure_reason(exc: BaseException) -> str:
    """``Type: message`` of the first real error inside ``exc`` (exception groups are
    unwrapped; the message keeps its lines, e.g. a dead node's last log lines), with a
    count of any further ones."""
    found = leaves(exc)
    first = found[0]
    text = f"{type(first).__name__}: {str(first).strip() or '(no message)'}"
    if len(found) > 1:
        text += f" (and {len(found) - 1} more)"
    return text


def format_trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def unit_reason(stage: str, reason: str) -> str:
    """The abort reason of an episode that a unit failure aborted."""
    return f"{UNIT_FAILED}: {stage}: {reason}"


async def run_in_group(runner: Runner, key: GroupKey, cells: Sequence[Cell],
                       body: Callable[[Group], Awaitable[None]]) -> GroupEnd:
    """Open the group, run ``body`` in it, close it; any failure comes back as a
    :class:`GroupEnd` naming the stage it happened in (rules 1-4), never raised."""
    entered = finished = False
    try:
        async with runner.open_group(key, cells) as group:
            entered = True
            await body(group)
            finished = True
    except Exception as exc:
        own = [e for e in leaves(exc) if isinstance(e, CallbackError)]
        if own:
            raise own[0].error from None
        stage = "start" if not entered else "teardown" if finished else "run"
        whole_run = [e for e in leaves(exc) if isinstance(e, UserError)
                     or (isinstance(e, HostError) and not isinstance(e, OSError))]
        if stage == "start" and whole_run:
            raise whole_run[0] from None  # rule 2: every unit would fail alike
        return GroupEnd(stage, failure_reason(exc), format_trace(exc))
    return GroupEnd()


FAILURES_LOG = "failures.log"


def record_failure(run_dir: RunDir, failure: UnitFailure) -> None:
    """Write a unit failure into the current session of the run's manifest, and its
    traceback into the run directory's failures.log."""
    with open(run_dir.path / FAILURES_LOG, "a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} unit {failure.group} "
                f"{failure.stage} (attempt {failure.attempt}) on {failure.worker or 'here'}"
                f"\n{failure.trace or failure.reason}\n")
    sessions = run_dir.read_manifest().get("sessions", [])
    if sessions:
        last = sessions[-1]
        sessions[-1] = {**last, "failures": [*last.get("failures", []), failure.as_dict()]}
        run_dir.update_manifest(sessions=sessions)


def describe_failure(failure: UnitFailure) -> str:
    """One line for the console."""
    if failure.retried:
        what = f"did not start (attempt {failure.attempt} of {START_ATTEMPTS}; trying again)"
    elif failure.stage == "start":
        what = f"did not start in {failure.attempt} attempts"
    elif failure.stage == "run":
        what = "failed under an episode"
    elif failure.stage == "worker":
        what = "failed on its cluster worker"
    else:
        what = "failed to tear down (what it left is recorded for `testbed clean`)"
    lost = f", {len(failure.aborted)} episodes aborted" if failure.aborted else ""
    return f"unit {failure.group} {what}{lost}: {one_line(Exception(failure.reason))}"


def summary_line(failures: Sequence[UnitFailure]) -> str:
    """The one line ``testbed run`` ends with when units failed (rule 5)."""
    failed = [f for f in failures if not f.retried]
    aborted = sum(len(f.aborted) for f in failed)
    stages = ", ".join(f"{sum(1 for f in failed if f.stage == s)} {s}"
                       for s in STAGES if any(f.stage == s for f in failed))
    return (f"testbed run: {len(failed)} unit failure(s) ({stages}), {aborted} episode(s) "
            f"aborted by them; first: {describe_failure(failed[0])}")


@contextlib.contextmanager
def contained_ledger(label: str) -> Iterator[tuple[Ledger, list[str]]]:
    """``open_run_ledger`` whose teardown error is reported, not raised: the list it
    yields then holds one line saying what stays recorded for ``testbed clean``."""
    left: list[str] = []
    ledger_path = ""
    try:
        with open_run_ledger(label) as ledger:
            ledger_path = str(ledger.path)
            yield ledger, left
            ledger_path = f"{ledger_path} (done)"
    except Exception as exc:
        if not ledger_path.endswith(" (done)"):
            raise  # the run itself failed: not a teardown error
        left.append(f"could not remove everything it made ({failure_reason(exc)}); what "
                    f"remains is recorded in {ledger_path.removesuffix(' (done)')} for "
                    "`testbed clean`")


def ending_lines(summary: RunSummary) -> list[str]:
    """What ``testbed run`` says last when units failed or things were left (rule 5)."""
    lines = [f"{summary_line(summary.failures)} (tracebacks: "
             f"{summary.out_dir / FAILURES_LOG})"] if summary.failures else []
    return lines + [f"testbed run: {item}" for item in summary.left]
