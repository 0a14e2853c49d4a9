"""What role calls cost: latency quantiles, tokens per second and failures, from the
calls as the node recorded them (``nodes.role_calls`` rule 2; a live run's
``decisions/*.jsonl``, or a benchmark's own calls).

Rules this module obeys (pure):

1. Latency is a call's own (first byte sent to decision, corrections included); p50 is
   the median, p95 the nearest-rank 95th percentile, over every call that has one.
2. Tokens are the server's ``usage`` counts summed over the call's completions; tokens
   per second are total tokens over the total latency of the calls that report tokens
   (so prompt_tokens_per_s is prompt throughput per second of role call, not the
   server's prompt-evaluation rate alone).
3. Failures are split by cause: ``schema`` (answers that broke the role's schema after
   every correction: the model's), ``endpoint`` (no answer at all: the server's), and
   ``other`` (another non-200 status, a garbled body).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from testbed.campaign.decisions import decision_files, read_calls
from testbed.errors import UserError

SCHEMA_MARK = "schema violation"
ENDPOINT_MARK = "gave no answer after"


def failure_kind(error: str) -> str:
    """``schema``, ``endpoint`` or ``other`` for a failed call's error (rule 3)."""
    if SCHEMA_MARK in error:
        return "schema"
    if ENDPOINT_MARK in error:
        return "endpoint"
    return "other"


def _p(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def role_call_stats(calls: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Rules 1-3 over recorded calls, overall and per role."""
    calls = list(calls)
    out = _stats(calls)
    out["by_role"] = {role: _stats([c for c in calls if c.get("role") == role])
                      for role in sorted({str(c.get("role", "")) for c in calls})}
    return out


def _stats(calls: list[Mapping[str, Any]]) -> dict[str, Any]:
    latencies = sorted(float(c["latency_ms"]) for c in calls
                       if isinstance(c.get("latency_ms"), (int, float)) and c["latency_ms"] > 0)
    failed = [str(c.get("error") or "") for c in calls if c.get("error")]
    kinds = [failure_kind(e) for e in failed]
    prompt = sum(int(c.get("prompt_tokens") or 0) for c in calls)
    completion = sum(int(c.get("completion_tokens") or 0) for c in calls)
    timed_s = sum(float(c.get("latency_ms") or 0) for c in calls
                  if int(c.get("prompt_tokens") or 0) + int(c.get("completion_tokens") or 0)
                  ) / 1000
    out: dict[str, Any] = {
        "calls": len(calls), "failures": len(failed),
        "schema_failures": kinds.count("schema"), "endpoint_failures": kinds.count("endpoint"),
        "other_failures": kinds.count("other"),
        "corrections": sum(int(c.get("corrections") or 0) for c in calls),
        "prompt_tokens": prompt, "completion_tokens": completion,
        "prompt_tokens_per_s": prompt / timed_s if timed_s > 0 else None,
        "completion_tokens_per_s": completion / timed_s if timed_s > 0 else None,
        "latency_ms_p50": statistics.median(latencies) if latencies else None,
        "latency_ms_p95": _p(latencies, 0.95) if latencies else None,
        "latency_ms_mean": statistics.fmean(latencies) if latencies else None,
    }
    return out


def run_role_call_stats(run: Path | str) -> dict[str, Any]:
    """The statistics of a committed live run's recorded role calls (its decisions/)."""
    path = Path(run)
    if not decision_files(path):
        raise UserError(f"--role-calls: {path} has no decisions/*.jsonl; allowed: the "
                        "results directory of a live run")
    return {"run": str(path), **role_call_stats(read_calls(path))}
