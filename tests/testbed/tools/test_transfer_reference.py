"""Figure C.1's reference line (testbed/tools/bench_transfer.py): drawn from a configured
or a live run's measured role-call duration, and only then; `--redraw` draws it again
from a measured transfer.json. Pure but for one `testbed bench transfer --redraw`
subprocess (it measures nothing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from testbed.errors import UserError
from testbed.tools.bench_transfer import role_call_reference, transfer_figure


def _result(reference: dict[str, Any] | None) -> dict[str, Any]:
    sizes = {str(k): {"p50_ms": 40.0 * k, "p95_ms": 60.0 * k, "mean_ms": 45.0 * k, "n": 3,
                      "samples_ms": [40.0 * k] * 3} for k in (1, 4, 16)}
    loss = {f"{p:g}": {"p50_ms": 50.0, "p95_ms": 80.0 + p, "mean_ms": 55.0, "n": 3,
                       "samples_ms": [50.0] * 3} for p in (0.0, 1.0)}
    return {"samples": 3, "sizes_kib": [1, 4, 16], "losses_pct": [0.0, 1.0], "seed": 1,
            "reference": reference,
            "networks": {"att": {"description": "", "definition": {}, "sizes": sizes,
                                 "loss": loss}}}


def _horizontal_lines(result: dict[str, Any]) -> list[tuple[float, str]]:
    figure = transfer_figure(result)
    out = []
    for ax in figure.axes:
        for line in ax.get_lines():
            ys = set(line.get_ydata())
            if len(ys) == 1 and line.get_linestyle() == ":":
                out.append((float(ys.pop()), str(line.get_label())))
    return out


def test_a_configured_role_call_draws_its_tenth_on_both_panels() -> None:
    reference = role_call_reference(role_call_ms=1170.0)
    assert reference is not None
    assert reference["line_ms"] == pytest.approx(117.0)
    assert reference["source"] == "configured"
    lines = _horizontal_lines(_result(reference))
    assert [y for y, _ in lines] == [pytest.approx(117.0)] * 2
    assert lines[0][1].startswith("117 ms: 10% of a 1170 ms role call (configured)")


def test_without_a_role_call_duration_there_is_no_line() -> None:
    assert role_call_reference() is None
    assert _horizontal_lines(_result(None)) == []


def test_a_live_runs_median_role_call_is_the_median_over_its_tasks(tmp_path: Path) -> None:
    run = tmp_path / "live"
    run.mkdir()
    pd.DataFrame({"episode": ["e1", "e2", "e3", "e4"],
                  "role_call_ms_p50": [1000.0, 3000.0, None, 2000.0]}).to_parquet(
        run / "actions.parquet")
    reference = role_call_reference(live_run=run)
    assert reference is not None
    assert reference["role_call_ms"] == 2000.0  # the task without a call is left out
    assert reference["line_ms"] == pytest.approx(200.0)
    assert reference["source"] == f"{run} (3 tasks)"
    assert "(measured: live)" in _horizontal_lines(_result(reference))[0][1]


def test_bad_sources_are_the_users_fault_and_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=re.escape("--role-call-ms: 0.0; must be > 0")):
        role_call_reference(role_call_ms=0.0)
    with pytest.raises(UserError, match="one source"):
        role_call_reference(role_call_ms=1000.0, live_run=tmp_path)
    with pytest.raises(UserError, match=r"--role-calls: .* has no actions\.parquet"):
        role_call_reference(live_run=tmp_path)
    pd.DataFrame({"episode": ["e1"], "stall_ms": [3.0]}).to_parquet(
        tmp_path / "actions.parquet")
    with pytest.raises(UserError, match="is not a live run"):
        role_call_reference(live_run=tmp_path)


@pytest.mark.slow
def test_redraw_draws_a_measured_result_again_with_the_line_given(tmp_path: Path) -> None:
    out = tmp_path / "transfer"
    command = [sys.executable, "-m", "testbed", "bench", "transfer", "--redraw", "--out",
               str(out), "--role-call-ms", "900"]
    missing = subprocess.run(command, text=True, capture_output=True, timeout=120,
                             check=False)
    assert missing.returncode != 0
    assert "--redraw: no" in missing.stderr
    assert "Traceback" not in missing.stderr
    out.mkdir()
    (out / "transfer.json").write_text(json.dumps(_result(None)))
    drawn = subprocess.run(command, text=True, capture_output=True, timeout=120,
                           check=False)
    assert drawn.returncode == 0, drawn.stderr
    written = json.loads((out / "transfer.json").read_text())
    assert written["reference"]["line_ms"] == pytest.approx(90.0)
    assert written["networks"] == _result(None)["networks"]  # the samples untouched
    assert (out / "fig_c1.png").stat().st_size > 0
    assert "90 ms: 10% of a 900 ms role call" in (out / "fig_c1.svg").read_text()
