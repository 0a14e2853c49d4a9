"""The command line: help, one-line errors, and the read-only sub-commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import build_parser, main


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize("argv", [[], ["traces"], ["bench"], ["run"]])
def test_missing_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("command", ["doctor", "traces", "run", "report", "clean", "bench"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: testbed" in capsys.readouterr().out


def test_traces_list_names_every_shipped_trace(tmp_path: Path) -> None:
    proc = _run("traces", "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("ATT-LTE-driving.up", "TMobile-LTE-short.down", "Verizon-LTE-short.up"):
        assert name in proc.stdout


def test_unknown_trace_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("traces", "show", "no-such-trace.up", cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_report_of_an_empty_directory_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"testbed report: {tmp_path} has no episodes.parquet (run a campaign into it first, "
        "or finish it with --resume)"]


def test_doctor_reports_a_backend_choice(tmp_path: Path) -> None:
    proc = _run("doctor", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "backend auto" in proc.stdout


@pytest.mark.privileged
def test_clean_runs_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("clean needs root")
    proc = _run("clean", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
