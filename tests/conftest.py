"""Suite-wide settings and pytest hooks.

The suite's runs share a host-lane state of their own (below), and its dask workers a
scratch directory of their own (``DASK_TEMPORARY_DIRECTORY``, set before any test module
imports dask, and removed at the end): without it they left empty
``/tmp/dask-scratch-space`` directories (``-65534`` for the rootless workers) behind.


pytest-trio re-raises a ``pytest.skip(reason)`` from inside an async test as a bare
``pytest.skip()`` when trio wrapped it in an exception group, and the reason is lost
(the report says only "Skipped"). The VM lane counts skips by their reason (a rate
this machine is too slow to test is an allowed skip, anything else is not), so the
reason is taken back from the original exception here.

At the end, the seconds each layer's tests took (setup, call and teardown, summed by
``tests/<layer>``, and ``tests/testbed/<stage>``) follow pytest's slowest durations.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from _pytest.outcomes import Skipped

from testbed.host.lanes import DIR_ENV

_DASK_SCRATCH: str | None = None
if "DASK_TEMPORARY_DIRECTORY" not in os.environ:
    _DASK_SCRATCH = tempfile.mkdtemp(prefix="pf-suite-dask-")
    os.chmod(_DASK_SCRATCH, 0o1777)  # like /tmp: the rootless workers run as uid 65534
    os.environ["DASK_TEMPORARY_DIRECTORY"] = _DASK_SCRATCH


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _DASK_SCRATCH is not None:
        shutil.rmtree(_DASK_SCRATCH, ignore_errors=True)


_LAYER_SECONDS: defaultdict[str, float] = defaultdict(float)
_LAYER_TESTS: defaultdict[str, int] = defaultdict(int)


def _layer(nodeid: str) -> str:
    """tests/nodes/test_x.py::t -> tests/nodes; tests/testbed/run/... -> tests/testbed/run;
    tests/test_house.py::t -> tests/test_house.py."""
    parts = nodeid.split("::", 1)[0].split("/")
    depth = 3 if len(parts) > 3 and parts[1] == "testbed" else 2
    return "/".join(parts[:depth])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    layer = _layer(report.nodeid)
    _LAYER_SECONDS[layer] += report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _LAYER_TESTS[layer] += 1


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    if len(_LAYER_SECONDS) < 2:
        return
    terminalreporter.section("seconds per layer")
    for layer, seconds in sorted(_LAYER_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s {_LAYER_TESTS[layer]:5d} tests  {layer}")
    terminalreporter.write_line(f"{sum(_LAYER_SECONDS.values()):8.1f} s in all")


def _inner_skip_reason(exc: BaseException | None) -> str | None:
    """The message of the one Skipped inside the exception group ``exc`` came from."""
    for _ in range(10):
        if exc is None:
            return None
        if isinstance(exc, BaseExceptionGroup):
            queue: list[BaseException] = [exc]
            while queue:
                e = queue.pop()
                if isinstance(e, BaseExceptionGroup):
                    queue.extend(e.exceptions)
                elif isinstance(e, Skipped) and e.msg:
                    return str(e.msg)
        exc = exc.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    lost = (call.excinfo is not None and report.skipped
            and isinstance(report.longrepr, tuple)
            and isinstance(call.excinfo.value, Skipped) and not call.excinfo.value.msg)
    if lost and call.excinfo is not None and isinstance(report.longrepr, tuple):
        reason = _inner_skip_reason(call.excinfo.value.__context__)
        if reason:
            path, lineno, _ = report.longrepr
            report.longrepr = (path, lineno, f"Skipped: {reason}")
    return report


@pytest.fixture(autouse=True, scope="session")
def _private_host_lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's `testbed run`s share a lane state of their own, not the host's: a
    test is not a measurement, so it neither waits for the campaigns that other people
    run on this host (a loopback test would wait for all of them to drain) nor holds
    them up. tests/testbed/run/test_host_lanes.py gives its runs a directory of its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DIR_ENV, str(tmp_path_factory.mktemp("host-lanes")))
        yield
