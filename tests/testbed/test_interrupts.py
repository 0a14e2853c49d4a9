"""Interrupts of `run` and `exec` (testbed.interrupts), in this process: SIGTERM does what
Ctrl-C does, a second signal during the cleanup is one line and cuts nothing short, and
an interrupt inside trio's exception groups is still an interrupt."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import trio

from testbed import interrupts


@pytest.fixture
def handled() -> Iterator[None]:
    """interrupts.handled() around the test, started with Python's own SIGINT handler
    (as from a terminal: a pytest-xdist worker starts with SIGINT ignored), and Python's
    own handlers back afterwards (an interrupted command leaves both signals ignored
    while its process exits)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
    try:
        with interrupts.handled():
            yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_handler_a_library_left_does_not_take_the_interrupt() -> None:
    """A SIGINT handler left by an earlier import (one that exits, say) is put aside:
    trio's own delivers the interrupt, and the left one comes back afterwards."""
    def left(signum: int, frame: object) -> None:
        raise SystemExit(3)

    signal.signal(signal.SIGINT, left)
    try:
        with interrupts.handled():
            assert _interrupted_run(signal.SIGINT, None) == ["cleaned up"]
    finally:
        assert signal.getsignal(signal.SIGINT) in (left, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupted_run(first: int, second: int | None) -> list[str]:
    """A trio run that gets FIRST while it waits and SECOND while it cleans up; what
    its cleanup did."""
    done: list[str] = []

    async def main() -> None:
        with interrupts.guard():
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.sleep_forever)
                    await trio.sleep(0.05)
                    os.kill(os.getpid(), first)
                    await trio.sleep(10)
            finally:
                with trio.CancelScope(shield=True):
                    if second is not None:
                        os.kill(os.getpid(), second)
                    await trio.sleep(0.2)  # the cleanup, which the second must not cut
                    done.append("cleaned up")

    with pytest.raises((KeyboardInterrupt, BaseExceptionGroup)) as caught:
        trio.run(main)
    assert interrupts.is_interrupt(caught.value), caught.value
    assert interrupts.signal_of(caught.value) == first
    return done


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_sigterm_is_a_ctrl_c_and_a_second_signal_waits_for_the_cleanup(
        handled: None, first: int, capfd: pytest.CaptureFixture[str]) -> None:
    assert _interrupted_run(first, signal.SIGINT) == ["cleaned up"]
    assert capfd.readouterr().err == interrupts.STILL_CLEANING


def test_a_second_sigterm_is_the_same_line(handled: None,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    assert _interrupted_run(signal.SIGINT, signal.SIGTERM) == ["cleaned up"]
    assert capfd.readouterr().err == interrupts.STILL_CLEANING


def test_an_ignored_sigint_stays_ignored_and_sigterm_still_stops(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A background job of a non-interactive shell starts with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.handled():
            async def main() -> None:
                with interrupts.guard():
                    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                    assert not interrupts.owns_sigterm()  # a topology's own handler then
                    os.kill(os.getpid(), signal.SIGINT)
                    await trio.sleep(0.2)  # not interrupted
                    os.kill(os.getpid(), signal.SIGTERM)
                    await trio.sleep(10)

            with pytest.raises(KeyboardInterrupt):
                trio.run(main)
            assert interrupts.received() == signal.SIGTERM
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert capfd.readouterr().err == ""


def test_outside_a_command_nothing_changes() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with interrupts.guard():
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert not interrupts.owns_sigterm()


def test_an_uninterrupted_command_gives_its_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    async def main() -> None:
        trio_handler = signal.getsignal(signal.SIGINT)
        with interrupts.guard():
            assert interrupts.owns_sigterm()
        assert signal.getsignal(signal.SIGINT) is trio_handler

    with interrupts.handled():
        trio.run(main)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_an_interrupt_is_found_inside_exception_groups() -> None:
    group = BaseExceptionGroup("nursery", [trio.Cancelled._create(),
                                           BaseExceptionGroup("inner", [KeyboardInterrupt()])])
    assert interrupts.is_interrupt(group)
    assert not interrupts.is_interrupt(ExceptionGroup("bugs", [ValueError("x")]))
    assert interrupts.signal_of(KeyboardInterrupt("SIGTERM: topology removed")) == \
        signal.SIGTERM
