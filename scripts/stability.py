"""The stability study's numbers (docs/benchmarks.md, "Stability"), from its run directories.

Each directory is one campaign of the same configuration (PlanFence and another policy
on one network, one rho, one connection setting), run with ``--rerun-disturbed N``. For
each it prints two views: "first attempts", the run as it would have been without
reruns (every episode's attempt 1), and "verdict rows", the report's view with reruns
(each episode's first undisturbed attempt, else its first; docs/reports.md, "Attempts").
Per view: both policies' cell medians of stall per action, their ratio, the paired
change with its 95% two-stage interval, resolution and verdict (the report's own
statistics), and the ordering of the cell medians. Per run: attempts, disturbed ones, and
what the host did during them (the nodes' run-queue wait per action and as a share of
their runnable time, the host's busy share and 1-minute load, medians over attempts).
Then, per view, the spread over the runs: PlanFence's cell median (range, and
coefficient of variation), the ratio's range, the verdicts and orderings seen.

Usage: .venv/bin/python scripts/stability.py DIR... [--a planfence] [--b batched_all_key]
       [--draws 10000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.report.attempts import collapse
from testbed.report.load import load_run
from testbed.report.stats import VERDICT_TEXT, compare, cost_episodes, paired
from testbed.results.schema import STRATUM_COLUMNS

VIEWS = ("first attempts", "verdict rows")


def _view(attempts: pd.DataFrame, actions: pd.DataFrame, name: str) -> pd.DataFrame:
    """One row per episode: attempt 1 (``first attempts``) or the report's verdict row."""
    if name == "first attempts":
        attempts = attempts[attempts["attempt"] == 1]
    return cost_episodes(collapse(attempts.drop(columns=["verdict"]), actions).episodes)


def _host(attempts: pd.DataFrame) -> dict[str, Any]:
    """What the host did to the attempts (medians over attempts)."""
    acted = attempts["attempted_actions"].where(attempts["attempted_actions"] > 0)
    runq = attempts["node_runq_wait_ms"]
    share = runq / (runq + attempts["node_cpu_ms"])
    return {"attempts": len(attempts), "disturbed": int(attempts["disturbed"].sum()),
            "runq_ms_per_action": round(float((runq / acted).median()), 1),
            "runq_share": round(float(share.median()), 3),
            "host_busy_pct": round(float(attempts["host_busy_pct"].median()), 1),
            "load_1m": round(float(attempts["host_load_1m"].median()), 1)}


def measure(path: Path, a: str, b: str, draws: int) -> dict[str, Any]:
    """The study's figures for one run directory."""
    run = load_run(path)
    out: dict[str, Any] = {"run": path.name, "campaign_seed": run.manifest.get("config", {})
                           .get("seed"), "host": _host(run.attempts), "views": {}}
    for name in VIEWS:
        episodes = _view(run.attempts, run.actions, name)
        med_a = float(episodes.loc[episodes["policy"] == a, "stall_ms_per_action"].median())
        med_b = float(episodes.loc[episodes["policy"] == b, "stall_ms_per_action"].median())
        pairs = paired(episodes, vary="policy", a=a, b=b, metric="stall_ms_per_action",
                       strata=list(STRATUM_COLUMNS))
        result = compare(pairs, draws=draws)
        if result is None:
            raise SystemExit(f"{path}: no paired episodes of {a} and {b}")
        out["views"][name] = {
            "episodes": len(episodes), "disturbed": int(episodes["disturbed"].sum()),
            "pairs": result.pairs, "median_a_ms": round(med_a, 1),
            "median_b_ms": round(med_b, 1), "ratio": round(med_a / med_b, 3),
            "change_pct": round(100 * result.change, 1),
            "interval_pct": [round(100 * result.change_low, 1),
                             round(100 * result.change_high, 1)],
            "resolution_pct": round(100 * result.resolution, 1),
            "verdict": VERDICT_TEXT[result.verdict],
            "ordering": f"{a} lower" if med_a < med_b else f"{a} not lower"}
    return out


def spread(runs: list[dict[str, Any]], view: str) -> dict[str, Any]:
    """The spread over runs of one view."""
    rows = [r["views"][view] for r in runs]
    medians = [r["median_a_ms"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    cv = statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else 0.0
    return {"runs": len(rows), "median_a_ms": [min(medians), max(medians)],
            "median_a_cv": round(cv, 3), "ratio": [min(ratios), max(ratios)],
            "verdicts": sorted({r["verdict"] for r in rows}),
            "orderings": sorted({r["ordering"] for r in rows}),
            "resolution_pct": [min(r["resolution_pct"] for r in rows),
                               max(r["resolution_pct"] for r in rows)]}


def _markdown(runs: list[dict[str, Any]], a: str, b: str) -> list[str]:
    lines = [f"| run | view | {a} ms | {b} ms | ratio | change [95%] | resolution | verdict "
             "| disturbed / attempts | run-queue wait ms/action (share) | host busy % "
             "| load 1m |", "|" + "---|" * 12]
    for r in runs:
        h = r["host"]
        for name in VIEWS:
            v = r["views"][name]
            low, high = v["interval_pct"]
            lines.append(
                f"| {r['run']} | {name} | {v['median_a_ms']} | {v['median_b_ms']} "
                f"| {v['ratio']} | {v['change_pct']:+}% [{low:+}, {high:+}] "
                f"| ±{v['resolution_pct']}% | {v['verdict']} "
                f"| {h['disturbed']} / {h['attempts']} | {h['runq_ms_per_action']} "
                f"({h['runq_share']}) | {h['host_busy_pct']} | {h['load_1m']} |")
    for name in VIEWS:
        s = spread(runs, name)
        lines.append(f"\n{name}: {s['runs']} runs; {a} cell median {s['median_a_ms'][0]}-"
                     f"{s['median_a_ms'][1]} ms (CV {s['median_a_cv']}); ratio "
                     f"{s['ratio'][0]}-{s['ratio'][1]}; resolution ±{s['resolution_pct'][0]}"
                     f"-{s['resolution_pct'][1]}%; verdicts {s['verdicts']}; orderings "
                     f"{s['orderings']}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--a", default="planfence")
    parser.add_argument("--b", default="batched_all_key")
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = [measure(d, args.a, args.b, args.draws) for d in args.dirs]
    print("\n".join(_markdown(runs, args.a, args.b)))
    if args.json is not None:
        summary = {name: spread(runs, name) for name in VIEWS}
        args.json.write_text(json.dumps({"runs": runs, "spread": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
