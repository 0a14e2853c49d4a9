"""Print results/README.md's claims with the values their data gives (the generator).

For every ``[[claim]]`` of results/claims.toml: the passage as the README should write
it, with each bracketed number replaced by what its expression gives at the precision
the README writes, and whether the README holds it. ``--uncovered`` lists the numbers
of the checked sections that no claim or given covers. The gate is
tests/test_claims.py; this is how a writer updates the README after a rerun.
Usage: .venv/bin/python scripts/claims.py [--uncovered] [--only TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.report.claims import (
    BRACKET,
    contains,
    evaluate,
    load_claims,
    mismatches,
    uncovered,
)

ROOT = Path(__file__).resolve().parents[1] / "results"


def _render(text: str, values: list[float]) -> str:
    it = iter(values)

    def one(match: object) -> str:
        shown = match.group(1)  # type: ignore[attr-defined]
        value = next(it, float("nan"))
        decimals = len(shown.split(".", 1)[1].rstrip("%")) if "." in shown else 0
        text = f"{value:,.{decimals}f}" if "," in shown else f"{value:.{decimals}f}"
        if shown.startswith("+") and value >= 0:
            text = "+" + text
        return text + ("%" if shown.endswith("%") else "")

    return BRACKET.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uncovered", action="store_true")
    parser.add_argument("--only", default="", help="claims whose text contains this")
    args = parser.parse_args(argv)
    readme = (ROOT / "README.md").read_text()
    claims = load_claims(ROOT / "claims.toml")
    bad = 0
    for claim in claims.claims:
        if args.only not in claim.text:
            continue
        try:
            values = evaluate(claim, ROOT)
        except Exception as exc:  # a broken expression: say which
            print(f"ERROR {claim.text[:60]}: {type(exc).__name__}: {exc}")
            bad += 1
            continue
        problems = mismatches(claim, values)
        present = contains(readme, claim)
        bad += bool(problems) or not present
        mark = "ok " if not problems and present else "BAD"
        print(f"{mark} [{claim.run}] {_render(claim.text, values)}")
        for problem in problems:
            print(f"      {problem}")
        if not present:
            print("      passage not in the README")
    if args.uncovered:
        for line in uncovered(readme, claims):
            print(f"uncovered: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
