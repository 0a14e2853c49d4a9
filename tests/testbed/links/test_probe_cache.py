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
    run = _counting(probe, works=False)
    assert probe_cache.cached_probe("netem", run, state_dir=tmp_path) == (False, "probe 1")
    again = probe_cache.cached_probe("netem", run, state_dir=tmp_path)
    assert again[0] is False
    assert "probe 1" in again[1]
    assert len(probe) == 1  # not probed again
    monkeypatch.setenv(probe_cache.FRESH_ENV, "1")
    assert probe_cache.cached_probe("netem", run, state_dir=tmp_path)[1] == "probe 2"
    monkeypatch.delenv(probe_cache.FRESH_ENV)
    key = probe_cache.kernel_key()
    monkeypatch.setattr(probe_cache, "kernel_key", lambda: f"{key}-module-loaded")
    assert probe_cache.cached_probe("netem", run, state_dir=tmp_path)[1] == "probe 3"
    (tmp_path / probe_cache.FILE_NAME).write_text("{not json")
    assert probe_cache.cached_probe("netem", run, state_dir=tmp_path)[1] == "probe 4"


def test_without_a_kernel_key_every_call_probes(tmp_path: Path, probe: list[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_cache, "kernel_key", lambda: None)
    run = _counting(probe)
    probe_cache.cached_probe("userspace", run, state_dir=tmp_path)
    probe_cache.cached_probe("userspace", run, state_dir=tmp_path)
    assert len(probe) == 2
    assert not (tmp_path / probe_cache.FILE_NAME).exists()
