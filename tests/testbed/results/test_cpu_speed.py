"""The host's CPU as a run session records it (testbed/results/cpu_speed.py)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from testbed.results.cpu_speed import cpu_model, python_probe_ms


def test_the_model_name_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: fpu\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 7B13 64-Core Processor"


def test_a_cpuinfo_without_a_model_name_falls_back(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t:\n")  # arm64 kernels print none
    assert cpu_model(info) == (platform.processor() or "unknown")
    assert cpu_model(tmp_path / "absent") == cpu_model(info)


def test_the_probe_times_real_work() -> None:
    probe_ms = python_probe_ms(repeats=2)
    # 20,000 dict updates and formatted strings take well over 0.5 ms on any CPU
    # that runs this suite, and far less than a minute
    assert 0.5 < probe_ms < 60_000


def test_the_probe_needs_a_repeat() -> None:
    with pytest.raises(ValueError, match="repeats: 0; allowed"):
        python_probe_ms(repeats=0)
