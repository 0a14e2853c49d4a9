"""results/README.md cannot drift from the reference runs' data (results/claims.toml).

Every claim's expression is evaluated over its run's parquet files and must round to
the number the README writes; every claimed passage must be in the README; every number
in the checked sections must be claimed or marked as given (not a measurement). The
rules are those of testbed/report/claims.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.report.claims import (
    Claim,
    ClaimsFile,
    contains,
    evaluate,
    load_claims,
    mismatches,
    uncovered,
)
from testbed.report.paper import reference_value

pytestmark = pytest.mark.claims

RESULTS = Path(__file__).resolve().parents[1] / "results"
CLAIMS = load_claims(RESULTS / "claims.toml")
README = (RESULTS / "README.md").read_text()


@pytest.mark.parametrize("claim", CLAIMS.claims, ids=lambda c: c.plain[:50])
def test_claim_holds(claim: Claim) -> None:
    assert contains(README, claim), "the claimed passage is not in results/README.md"
    assert claim.written, "a claim without a bracketed number checks nothing"
    assert mismatches(claim, evaluate(claim, RESULTS)) == []


@pytest.mark.parametrize("given", CLAIMS.given, ids=lambda c: c.plain[:50])
def test_given_is_in_the_readme(given: Claim) -> None:
    assert contains(README, given)
    assert given.why


PAPER_GIVEN = [g for g in CLAIMS.given if g.paper]


@pytest.mark.parametrize("given", PAPER_GIVEN, ids=lambda c: c.plain[:50])
def test_given_from_the_paper_matches_its_table(given: Claim) -> None:
    """A given citing the paper's tables names its cells (testbed/report/paper_numbers.csv)
    and each bracketed number is what they give, to the README's last digit."""
    values = [reference_value(ref) for ref in given.paper]
    assert mismatches(given, values) == []


def test_givens_cite_the_paper_file() -> None:
    assert len(PAPER_GIVEN) >= 20, "the paper's givens lost their references"


def test_every_number_of_the_checked_sections_is_covered() -> None:
    assert CLAIMS.checked_sections, "no section is checked"
    assert uncovered(README, CLAIMS) == []


def test_the_rules_catch_drift(tmp_path: Path) -> None:
    """A claim whose README number is off by more than half a unit fails, and a number
    nobody claims is reported."""
    claim = Claim(text="PlanFence [4-5] ms", expr="[2.6, 3.0]")
    assert mismatches(Claim(text="a [1352] b", expr=""), [1352.4]) == []
    assert mismatches(Claim(text="a [1352] b", expr=""), [1352.6]) != []
    assert mismatches(Claim(text="a [-48.8%] b", expr=""), [-48.84]) == []
    assert mismatches(Claim(text="a [1,468] b", expr=""), [1468]) == []
    assert mismatches(claim, [2.6, 3.0]) != []
    readme = "# T\n\n## S\n\nPlanFence 1352 ms/action at rho = 4 over 30 templates.\n"
    assert len(uncovered(readme, ClaimsFile([], [], ["S"]))) == 1
    covered = ClaimsFile([Claim(text="PlanFence [1352] ms", expr="1352")], [], ["S"])
    assert uncovered(readme, covered) == []
