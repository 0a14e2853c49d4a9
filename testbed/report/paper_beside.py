"""The report's section "The paper beside this run": the paper's table cells the run
compares with (``testbed/report/paper_map.py``) beside the run's values, as a table for
tables/ and report.md/html, or one line when no cell compares."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from testbed.report import naming
from testbed.report.load import Run
from testbed.report.paper import COLUMNS, PAPER_FILE, TABLES, PaperCell
from testbed.report.paper_map import Beside, beside, study_tables
from testbed.report.tables_trials import SCENARIO_TITLES
from testbed.report.tabular import Cell, Table, fmt

TABLE_NAME = "paper_beside"
TITLE = "The paper's table cells beside this run's values"


_LABELS = {"agents": "N", "units": "T", "deps": "d"}
_SETTING_TEXT = {"trace_offset_s": "offset {} s", "replan_delay_s": "delay {} s",
                 "update_rate_per_s": "{} updates/s", "keys": "{} keys", "batch": "batch {}",
                 "network": "{}"}
_CONNECTIONS = {"fresh": "new connection per RPC", "reuse": "reused connections",
                "reuse_warm": "pre-warmed connections"}


def row_title(cell: PaperCell) -> str:
    """The row as a reader knows it: the method, then its settings."""
    settings = dict(cell.row)
    parts: list[str] = []
    if "policy" in settings:
        parts.append(naming.display_name(settings.pop("policy")))
    if "selector" in settings:
        parts.append(settings.pop("selector"))
    if settings.pop("executor_inputs", "local") == "fresh":
        parts.append("executor fresh before generation")
    if "scenario" in settings:
        parts.append(SCENARIO_TITLES[settings.pop("scenario")].lower())
    if settings.pop("update_target", "relevant") == "unrelated":
        parts.append("unrelated updates only")
    if "connection" in settings:
        parts.append(_CONNECTIONS.get(settings.pop("connection"), "?"))
    for name, value in settings.items():
        parts.append(_SETTING_TEXT.get(name, f"{_LABELS.get(name, name)}={{}}").format(value))
    return ", ".join(parts)


def paper_table(run: Run, cells: Sequence[PaperCell] | None = None) -> Table | None:
    """The report's table of the paper's cells beside the run (None: no comparable
    cell; :func:`no_match_line` says so)."""
    rows = beside(run, cells)
    if not rows:
        return None
    tables, known = study_tables(run)
    used = sorted({t for r in rows for t in r.tables}, key=TABLES.index)
    body: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    for r in rows:
        body.append([Cell(", ".join(r.tables)), Cell(row_title(r.cell)),
                     Cell(COLUMNS[r.cell.column].title), Cell(r.cell.unit),
                     Cell(r.cell.value), Cell(r.testbed_text),
                     Cell(fmt(r.ratio, 2)), Cell(str(r.episodes))])
        records.append({"paper_tables": " ".join(r.tables), "row": r.cell.row_text,
                        "column": r.cell.column, "unit": r.cell.unit,
                        "paper_value": r.cell.value, "paper_share": r.cell.share,
                        "testbed_value": r.testbed_text, "testbed_number": r.testbed_number,
                        "ratio": r.ratio, "episodes": r.episodes,
                        "note": "; ".join(r.notes)})
    data = pd.DataFrame(records)
    data.insert(0, "campaign", run.campaign)
    which = (f"the {run.campaign} study: tables {', '.join(tables)}" if known else
             "not a known study: every table of its kind, first match per selection")
    return Table(
        name=TABLE_NAME,
        title=TITLE,
        header=["Paper table", "Row", "Column", "Unit", "Paper", "Testbed",
                "Testbed / paper", "Episodes"],
        rows=body,
        data=data,
        provenance=(f"Campaign {run.campaign} ({which}); {len(rows)} cells from paper "
                    f"tables {', '.join(used)}; paper values from testbed/report/"
                    f"{PAPER_FILE.name}."),
        legend="Paper: the value the paper's table prints. Testbed: this run's value of "
        "the same statistic over the episodes (or trials) with the row's settings and "
        "the table's fixed ones, other settings pinned as in the tables above; costs are "
        "medians over templates (per-offset medians for rows that span offsets). "
        "Testbed / paper: their ratio (for counts out of a denominator, of the shares; – "
        "when the paper's is zero). Episodes: the run's episodes (or trials) in the "
        "selection, aborted ones included. Stall on emulated LTE is "
        "expected well above the paper's (docs/reports.md); compare ratios across rows.",
        findings=_findings(rows),
    )


def _findings(rows: Sequence[Beside]) -> list[str]:
    findings = []
    for column in ("stall", "traffic"):
        ratios = pd.Series([r.ratio for r in rows if r.cell.column == column], dtype=float)
        ratios = ratios[ratios.notna()]
        if len(ratios):
            findings.append(f"{COLUMNS[column].title.capitalize()}: testbed / paper median "
                            f"{fmt(float(ratios.median()), 2)} over {len(ratios)} cells "
                            f"(range {fmt(float(ratios.min()), 2)}-"
                            f"{fmt(float(ratios.max()), 2)}).")
    counts = [r for r in rows if r.cell.unit == "count" and r.cell.column != "connections"]
    if counts:
        same = sum(1 for r in counts if r.testbed_text == r.cell.value)
        findings.append(f"Counts: {same} of {len(counts)} equal the paper's as printed.")
    return findings


def no_match_line(run: Run) -> str:
    """One line for a run with no comparable cell."""
    tables, known = study_tables(run)
    if known and not tables:
        return (f"No comparable cell: the paper prints no table numbers for the "
                f"{run.campaign} study.")
    if known:
        return (f"No comparable cell: none of this run's cells has the settings of the "
                f"paper's tables {', '.join(tables)}.")
    return ("No comparable cell: none of this run's cells has the settings of a paper "
            "table cell (testbed/report/paper_numbers.csv).")


def paper_section(run: Run) -> tuple[Table | None, str]:
    """The report's section: the table, or the one line that says there is none."""
    table = paper_table(run)
    return table, "" if table is not None else no_match_line(run)

