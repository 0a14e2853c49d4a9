"""Suite-wide settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.host.lanes import DIR_ENV


@pytest.fixture(autouse=True, scope="session")
def _private_host_lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's `testbed run`s share a lane state of their own, not the host's: a
    test is not a measurement, so it neither waits for the campaigns that other people
    run on this host (a loopback test would wait for all of them to drain) nor holds
    them up. tests/testbed/run/test_host_lanes.py gives its runs a directory of its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DIR_ENV, str(tmp_path_factory.mktemp("host-lanes")))
        yield
