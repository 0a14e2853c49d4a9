"""Run the learned-selector study (table D.10) over result directories.

``python -m testbed.tools.selector_study RUN [RUN ...] --out DIR`` reads each run's
episodes and actions, builds the examples (``testbed.report.selector_data``), trains and
scores the selectors (``testbed.report.selector``) and writes ``table_d10.md`` and
``table_d10.json`` to DIR. The preset ``selector`` produces one run that holds every
block; older runs (``rates``, ``d7``, ``reuse``) can be pooled with it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from testbed.report.load import load_run
from testbed.report.selector import Score, evaluate
from testbed.report.selector_data import (
    BLOCKS,
    ENDPOINT_KEYS,
    build_examples,
    episode_outcomes,
    split_examples,
)

LABELS = {"rate_rule": "Transparent rate rule", "fixed_planfence": "Fixed PlanFence",
          "oracle": "Perfect oracle (bound)", "decision_tree": "Depth-3 decision tree",
          "two_layer_mlp": "Two-layer MLP (3 seeds)"}


def _f(x: float, digits: int = 1) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def render(results: dict[str, dict[str, object]], counts: dict[str, int]) -> str:
    lines = ["| Selector | Safe near-opt. ID (%) | OOD (%) | "
             + " | ".join(f"{b} (%)" for b in BLOCKS)
             + " | Regret p95 ID (ms) | OOD (ms) | Inference p95 (ms/query) | All-shift dominance |",
             "|" + "---|" * (7 + len(BLOCKS))]
    for name, result in results.items():
        s = result["scores"]
        assert isinstance(s, dict)
        dom = result.get("dominates", None)
        lines.append(" | ".join([
            f"| {LABELS[name]}", _f(s["in_distribution"].safe_pct), _f(s["ood"].safe_pct),
            *[_f(s[b].safe_pct) for b in BLOCKS], _f(s["in_distribution"].regret_p95_ms),
            _f(s["ood"].regret_p95_ms), _f(float(result["inference_p95_ms"]), 2),  # type: ignore[arg-type]
            "reference" if name == "rate_rule" else ("-" if not result["learned"] else
                                                     {True: "yes", False: "no",
                                                      None: "no OOD data"}[dom]),  # type: ignore[index]
        ]) + " |")
    lines.append("")
    lines.append("Examples: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".")
    return "\n".join(lines) + "\n"


def study(runs: Sequence[Path], *, example_templates: int, held_out_network: str,
          endpoint_keys: Sequence[int] = ENDPOINT_KEYS,
          ) -> tuple[dict[str, dict[str, object]], dict[str, int], pd.DataFrame]:
    outcomes = []
    for path in runs:
        run = load_run(path)
        outcomes.append(episode_outcomes(run.episodes, run.actions))
    examples = build_examples(pd.concat(outcomes, ignore_index=True),
                              example_templates=example_templates)
    split = split_examples(examples, held_out_network=held_out_network,
                           endpoint_keys=endpoint_keys)
    counts = {"train": len(split.train), "in_distribution": len(split.in_distribution),
              **{b: len(f) for b, f in split.blocks.items()}}
    return evaluate(split), counts, examples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.tools.selector_study")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--example-templates", type=int, default=3)
    parser.add_argument("--held-out-network", default="verizon")
    parser.add_argument("--endpoint-keys", default="8,128",
                        help="key counts held out as the keyspace block (comma list; "
                        "'' for none, when every run has one key count)")
    args = parser.parse_args(argv)
    endpoint = [int(k) for k in args.endpoint_keys.split(",") if k.strip()]
    results, counts, examples = study(args.runs, example_templates=args.example_templates,
                                      held_out_network=args.held_out_network,
                                      endpoint_keys=endpoint)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table_d10.md").write_text(render(results, counts))
    payload = {name: {**{k: v for k, v in r.items() if k != "scores"},
                      "scores": {p: s.as_dict() for p, s in r["scores"].items()  # type: ignore[attr-defined]
                                 if isinstance(s, Score)}}
               for name, r in results.items()}
    (args.out / "table_d10.json").write_text(json.dumps(
        {"counts": counts, "runs": [str(p) for p in args.runs], "selectors": payload,
         "endpoint_keys": endpoint, "held_out_network": args.held_out_network,
         "example_templates": args.example_templates,
         "targets": examples["target"].value_counts().to_dict() if len(examples) else {}},
        indent=2, default=str) + "\n")
    print((args.out / "table_d10.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
