"""Backend probe verdicts kept per boot and set of kernel modules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.links import probe_cache


@pytest.fixture
def probe() -> list[int]:
    return []


def _counting(calls: list[int], works: bool = True):  # type: ignore[no-untyped-def]
    def run() -> tuple[bool, str]:
        calls.append(1)
        return works, f"probe {len(calls)}"
    return run


@pytest.mark.skipif(os.geteuid() != 0, reason="verdicts are kept for root only")
def test_a_verdict_is_kept_until_the_kernel_changes(tmp_path: Path, probe: list[int],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    run = _counting(probe)
    assert probe_cache.cached_probe("userspace", run, state_dir=tmp_path) == (True, "probe 1")
    again = probe_cache.cached_probe("userspace", run, state_dir=tmp_path)
    assert again[0] is True
    assert "probe 1" in again[1]
    assert len(probe) == 1  # a working backend is not probed again
    monkeypatch.setenv(probe_cache.FRESH_ENV, "1")  # probes, and stores nothing
    assert probe_cache.cached_probe("userspace", _counting([], works=False),
                                    state_dir=tmp_path)[0] is False
    monkeypatch.delenv(probe_cache.FRESH_ENV)
    assert probe_cache.cached_probe("userspace", run, state_dir=tmp_path)[0] is True
    key = probe_cache.kernel_key()
    monkeypatch.setattr(probe_cache, "kernel_key", lambda: f"{key}-module-loaded")
    assert probe_cache.cached_probe("userspace", run, state_dir=tmp_path)[1] == "probe 2"
    (tmp_path / probe_cache.FILE_NAME).write_text("{not json")
    assert probe_cache.cached_probe("userspace", run, state_dir=tmp_path)[1] == "probe 3"


@pytest.mark.skipif(os.geteuid() != 0, reason="verdicts are kept for root only")
def test_a_failure_is_kept_once_it_was_found_twice(tmp_path: Path) -> None:
    calls: list[int] = []

    def failing() -> tuple[bool, str]:
        calls.append(1)
        return False, "no sch_netem"

    for _ in range(4):
        assert probe_cache.cached_probe("netem", failing, state_dir=tmp_path)[0] is False
    assert len(calls) == 2  # probed until the same failure was seen twice
    flaky = [(False, "EBUSY"), (False, "no sch_netem"), (True, "works")]
    calls.clear()

    def changing() -> tuple[bool, str]:
        calls.append(1)
        return flaky[len(calls) - 1]

    other = tmp_path / "other"
    for _ in range(3):
        probe_cache.cached_probe("netem", changing, state_dir=other)
    assert probe_cache.cached_probe("netem", changing, state_dir=other)[0] is True
    assert len(calls) == 3


def test_without_a_kernel_key_every_call_probes(tmp_path: Path, probe: list[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_cache, "kernel_key", lambda: None)
    run = _counting(probe)
    probe_cache.cached_probe("userspace", run, state_dir=tmp_path)
    probe_cache.cached_probe("userspace", run, state_dir=tmp_path)
    assert len(probe) == 2
    assert not (tmp_path / probe_cache.FILE_NAME).exists()
