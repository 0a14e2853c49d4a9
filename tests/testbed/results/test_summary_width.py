"""The summary `testbed run` prints at the end fits an 80-column terminal: shared settings
on one line, names wrapped (never cut), short headers explained in a legend."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from rich.console import Console

from testbed.results.summary import print_summary

RUN = Path(__file__).resolve().parents[3] / "results" / "budget"  # a committed run


def _printed(width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, record=True)
    print_summary(RUN, console)
    return console.export_text().splitlines()


def _policy_cells(lines: list[str]) -> list[str]:
    """The policy column's text per table row, wrapped pieces joined: a row starts on
    the line whose stall cell (always filled) is not blank."""
    rows: list[str] = []
    for line in lines:
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[-2]:  # stall
            rows.append(cells[0])
        else:
            rows[-1] += cells[0]
    return rows


def test_the_summary_fits_80_columns_and_keeps_every_name_whole() -> None:
    lines = _printed(80)
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "every cell: network att, keys 8, agents 5, deps 4, conn reuse"
    policies = pd.read_parquet(RUN / "episodes.parquet", columns=["cell", "policy"])
    expected = policies.drop_duplicates("cell")["policy"].tolist()
    assert sorted(_policy_cells(lines)) == sorted(expected)  # none cut short
    legend = next(line for line in lines if line.startswith("rho") or "inv/iss:" in line)
    assert "inv/iss: invalid/issued actions" in legend
    assert "stall: median stall ms/action" in legend


def test_a_wide_terminal_gets_the_full_headers_and_no_legend() -> None:
    text = "\n".join(_printed(200))
    assert "invalid/issued" in text
    assert "stall ms/action" in text
    assert "inv/iss:" not in text
