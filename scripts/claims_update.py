"""Rewrite the numbers of results/README.md's claims that their data now gives.

For every ``[[claim]]`` of results/claims.toml whose passage is in the README and whose
expression gives as many numbers as it has brackets, but not the numbers written: the
passage in the README and the claim's text get the data's numbers, at the precision
written. Only numbers change: a claim whose words no longer hold (an ordering that
flipped, a tie that is not one) is the writer's to rewrite, and the claim's expression
is what says so when it returns nothing. Prints each passage it rewrote. The writer
reads them: this is the after-a-rerun step of scripts/claims.py, not a substitute for
reading the findings.
Usage: .venv/bin/python scripts/claims_update.py [--only TEXT]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from testbed.report.claims import BRACKET, contains, evaluate, load_claims, mismatches

sys.path.insert(0, str(Path(__file__).resolve().parent))
from claims import _render  # the generator's own rendering

ROOT = Path(__file__).resolve().parents[1] / "results"


def _pattern(claim_text: str) -> re.Pattern[str]:
    """The claim's passage as it may be wrapped in the README (any run of spaces and
    newlines between words), each bracketed number a group."""
    parts: list[str] = []
    for i, piece in enumerate(BRACKET.split(claim_text)):
        if i % 2:  # a bracketed number
            parts.append("(" + re.escape(piece) + ")")
        else:
            parts.append(r"\s+".join(re.escape(w) for w in re.split(r"\s+", piece))
                         if piece.strip() else (r"\s+" if piece else ""))
    return re.compile("".join(parts))


def _toml_string(text: str) -> str:
    """TEXT as claims.toml writes a basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="claims whose text contains this")
    args = parser.parse_args(argv)
    readme_path, claims_path = ROOT / "README.md", ROOT / "claims.toml"
    readme, toml = readme_path.read_text(), claims_path.read_text()
    changed = 0
    for claim in load_claims(claims_path).claims:
        if args.only not in claim.text or not contains(readme, claim):
            continue
        values = evaluate(claim, ROOT)
        if len(values) != len(BRACKET.findall(claim.text)) or not mismatches(claim, values):
            continue
        new_text = _render(claim.text, values)
        shown = [_render(m.group(0), [v])
                 for m, v in zip(BRACKET.finditer(claim.text), values, strict=True)]
        new_claim = "".join(
            piece if i % 2 == 0 else "[" + shown[i // 2] + "]"
            for i, piece in enumerate(BRACKET.split(claim.text)))
        found = _pattern(claim.text).search(readme)
        quoted = _toml_string(claim.text)
        if found is None or quoted not in toml:
            print(f"SKIP (not found verbatim): {claim.text[:70]}")
            continue
        pieces, last = [], found.start()
        for group, number in enumerate(shown, start=1):
            pieces += [readme[last:found.start(group)], number]
            last = found.end(group)
        readme = readme[:found.start()] + "".join(pieces) + readme[last:]
        toml = toml.replace(quoted, _toml_string(new_claim), 1)
        changed += 1
        print(f"[{claim.run}] {new_text}")
    readme_path.write_text(readme)
    claims_path.write_text(toml)
    print(f"{changed} claim(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
