"""The paper's numbers as data (testbed/report/paper.py): the shipped file parses, every
kind of bad line is a one-line error naming its line and field, claims' references give
the printed numbers, and a synthetic run's cells are mapped to the paper's with the same
statistic the report's tables use."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from testbed.errors import UserError
from testbed.report.build import build_report
from testbed.report.load import Run, load_run, with_action_counts
from testbed.report.paper import (
    PAPER_FILE,
    TABLES,
    load_paper,
    lookup,
    parse_paper,
    reference_value,
)
from testbed.report.paper_beside import TABLE_NAME, no_match_line, paper_table
from testbed.report.paper_map import STUDIES, TABLE_SPECS, beside
from tests.testbed.report.report_fixtures import make_campaign

HEADER = "table,row,column,value,unit,note\n"
GOOD = (
    "# a comment line, then the header\n"
    + HEADER
    + "2,policy=planfence,stall,230.8,ms/action,\n"
    "2,policy=batched_all_key,stall,258.4,ms/action,\n"
    "2,policy=planfence,invalid/issued,0/330,count,\n"
    "D.7,rho=4,planfence_vs_batched,-24.8,%,PlanFence over batched - 1\n"
    "D.8,connection=fresh batch=1,reduction,24.1,%,\n"
    "F.1,policy=planfence replan_delay_s=0 update_rate_per_s=2 update_target=relevant,"
    "block,5,count,\n"
)


# --- the file ------------------------------------------------------------------------------


def test_every_row_of_the_shipped_file_parses() -> None:
    cells = load_paper()
    assert len(cells) > 700
    assert load_paper(PAPER_FILE) == cells
    assert {c.table for c in cells} == set(TABLES)
    for cell in cells:
        assert lookup(cell.key) is cell  # a claim can name every cell
    # a few cells as the paper prints them
    assert lookup("2|policy=planfence|stall").value == "230.8"
    assert lookup("D.7|rho=0.25|planfence_vs_batched").value == "-24.9"
    assert lookup("H.1|policy=planfence keys=128 rho=4 connection=reuse|stall").note
    assert lookup("G.1|policy=planfence scenario=handoff|detected").value == "29/30"


def test_every_table_has_its_settings_and_every_study_names_tables_of_the_file() -> None:
    assert set(TABLE_SPECS) == set(TABLES)
    for tables in STUDIES.values():
        assert set(tables) <= set(TABLE_SPECS)


def test_the_file_ships_in_the_wheel() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml")
                              .read_text())
    assert PAPER_FILE.name in pyproject["tool"]["setuptools"]["package-data"]["testbed.report"]


def test_a_good_file_parses_with_comments_fractions_and_notes() -> None:
    cells = parse_paper(GOOD, "good.csv")
    assert [c.line for c in cells] == [3, 4, 5, 6, 7, 8]
    first, _, count, pair, *_ = cells
    assert (first.table, first.row, first.column, first.number) == \
        ("2", (("policy", "planfence"),), "stall", 230.8)
    assert count.parts == (0.0, 330.0)
    assert count.share == 0.0
    assert count.is_fraction
    assert pair.note == "PlanFence over batched - 1"
    assert pair.number == -24.8
    # the note column may be left out of the header and the lines
    bare = parse_paper("table,row,column,value,unit\n2,policy=planfence,stall,230.8,ms/action\n")
    assert bare[0].note == ""
    # numbers in a row are normalised: rho=4.0 is rho=4
    again = parse_paper(HEADER + "D.7,rho=4.0,planfence_vs_batched,-24.8,%,\n")
    assert again[0].row == (("rho", "4"),)


@pytest.mark.parametrize(("line", "field", "says"), [
    ("X.9,policy=planfence,stall,1.0,ms/action,", "table", "allowed: 1a"),
    ("2,policy=nope,stall,1.0,ms/action,", "row", "unknown 'nope'"),
    ("2,colour=red,stall,1.0,ms/action,", "row", "allowed: policy"),
    ("2,policy=planfence policy=planfence,stall,1.0,ms/action,", "row", "given twice"),
    ("2,policy,stall,1.0,ms/action,", "row", "name=value"),
    ("2,,stall,1.0,ms/action,", "row", "empty"),
    ("2,policy=planfence rho=fast,stall,1.0,ms/action,", "row", "rho: 'fast'"),
    ("2,policy=planfence keys=8.5,stall,1.0,ms/action,", "row", "whole number"),
    ("2,policy=planfence network=mars,stall,1.0,ms/action,", "row", "allowed: loopback"),
    ("2,policy=planfence,speed,1.0,ms/action,", "column", "allowed: stall"),
    ("2,policy=planfence,stall,fast,ms/action,", "value", "decimal number"),
    ("2,policy=planfence,stall,1/2,ms/action,", "value", "decimal number"),
    ("2,policy=planfence,invalid/issued,3,count,", "value", "29/30"),
    ("2,policy=planfence,invalid/issued,31/30,count,", "value", "no larger"),
    ("2,policy=planfence,stall,1.0,s,", "unit", "allowed: ms/action"),
    ("2,policy=planfence,stall,230.8,ms/action,", "row", "already given on line 3"),
])
def test_each_kind_of_bad_line_names_its_line_and_field(line: str, field: str,
                                                        says: str) -> None:
    text = "# comment\n" + HEADER + "2,policy=planfence,stall,230.8,ms/action,\n" + line + "\n"
    with pytest.raises(UserError) as caught:
        parse_paper(text, "mine.csv")
    message = str(caught.value)
    assert message.startswith(f"mine.csv line 4: {field}: "), message
    assert says in message
    assert "\n" not in message


def test_a_bad_header_or_field_count_or_file_is_one_line() -> None:
    with pytest.raises(UserError, match=r"line 1: header: .*allowed: table,row,column"):
        parse_paper("table,row,value\n")
    with pytest.raises(UserError, match="no header"):
        parse_paper("# only a comment\n")
    with pytest.raises(UserError, match=r"line 2: 3 fields; allowed: 5 or 6"):
        parse_paper(HEADER + "2,policy=planfence,stall\n")
    with pytest.raises(UserError, match="cannot be read"):
        load_paper(Path("/nonexistent/paper_numbers.csv"))


def test_references_give_printed_and_derived_numbers() -> None:
    cells = parse_paper(GOOD)
    assert reference_value("2|policy=planfence|stall", cells) == 230.8
    assert reference_value("2|policy=planfence|invalid/issued", cells) == 0.0
    assert reference_value("{2|policy=planfence|invalid/issued#den}", cells) == 330.0
    change = reference_value("100 * ({2|policy=planfence|stall} / "
                             "{2|policy=batched_all_key|stall} - 1)", cells)
    assert change == pytest.approx(100 * (230.8 / 258.4 - 1))
    assert reference_value("-{D.7|rho=4|planfence_vs_batched}", cells) == 24.8
    assert reference_value("{sum:F.1|policy=planfence|block}", cells) == 5.0
    for bad, says in (("2|policy=planfence|traffic", "no such cell"),
                      ("2|policy=planfence", "allowed: table|row|column"),
                      ("{2|policy=planfence|stall} ** 2", "allowed: numbers"),
                      ("{2|policy=planfence|stall#den}", "not a count"),
                      ("__import__('os')", "allowed: table|row|column")):
        with pytest.raises(UserError, match=says.replace("|", r"\|")):
            reference_value(bad, cells)


# --- the mapping on synthetic runs -----------------------------------------------------------


def _run(name: str, grids: list[dict[str, Any]], tmp_path: Path, **kw: Any) -> Run:
    return load_run(make_campaign(name, grids, **kw).write(tmp_path / name))


def _median(frame: pd.DataFrame, **where: Any) -> float:
    for column, value in where.items():
        frame = frame[frame[column] == value]
    return float(np.median(frame.loc[~frame["aborted"], "stall_ms_per_action"]))


def test_a_known_study_maps_each_cell_with_the_tables_statistic(tmp_path: Path) -> None:
    run = _run("primary", [{"policy": ["planfence", "batched_all_key", "metadata_sync",
                                       "metadata_sync/2"]}], tmp_path)
    rows = beside(run)
    by = {(r.cell.setting("policy"), r.cell.column): r for r in rows
          if r.cell.setting("rho") is None}
    stall = by[("planfence", "stall")]
    # the same printed number of the same cell in three tables: one row
    assert stall.tables == ["2", "D.1", "D.2"]
    expected = _median(run.episodes, policy="planfence")
    assert stall.testbed == pytest.approx(expected)
    assert stall.ratio == pytest.approx(expected / 230.8)
    assert stall.episodes == 9
    invalid = by[("planfence", "invalid/issued")]
    assert invalid.testbed == (0, 99)
    assert invalid.testbed_text == "0/99"
    assert np.isnan(invalid.ratio)  # the paper's share is zero
    available = by[("planfence", "available/scheduled")]
    assert available.testbed == (99, 99)
    assert available.ratio == pytest.approx(1.0)
    assert ("metadata_sync/2", "invalid/issued") in by  # D.1's K = 2 row
    # D.2's rho = 4 rows: K = 2 valid / scheduled, and stall merged with D.1
    d2 = [r for r in rows if r.cell.table == "D.2" or "D.2" in r.tables]
    assert {r.cell.column for r in d2} >= {"valid/scheduled", "stall"}
    # no cell of a table the study does not reproduce (D.7, H.1, D.9 ...)
    assert {t for r in rows for t in r.tables} <= {"2", "D.1", "D.2"}


def test_a_campaign_that_is_no_study_keeps_the_first_table_per_selection(
        tmp_path: Path) -> None:
    run = _run("mine", [{"policy": ["planfence", "batched_all_key"]}], tmp_path)
    rows = beside(run)
    stall = [r for r in rows if r.cell.column == "stall"
             and r.cell.setting("policy") == "planfence"]
    assert len(stall) == 1
    assert stall[0].tables == ["2"]
    # D.7's PlanFence-vs-batched change at rho = 4 reads the two policies' medians
    (change,) = [r for r in rows if r.cell.column == "planfence_vs_batched"]
    pf, bk = (_median(run.episodes, policy=p) for p in ("planfence", "batched_all_key"))
    assert change.testbed == pytest.approx(100 * (pf / bk - 1))
    assert change.episodes == 18
    (reduction,) = [r for r in rows if r.cell.column == "reduction"]
    assert reduction.cell.setting("connection") == "fresh"
    assert reduction.testbed == pytest.approx(100 * (1 - pf / bk))


def test_a_cell_spanning_offsets_is_the_median_of_per_offset_medians(tmp_path: Path) -> None:
    run = _run("scope", [{"policy": ["planfence", "batched_all_key"], "keys": [8, 128],
                          "trace_offset_s": [0.0, 5.0, 15.0]}], tmp_path)
    rows = beside(run)
    d5 = {(r.cell.setting("policy"), r.cell.setting("keys")): r for r in rows
          if r.cell.table == "D.5" and r.cell.column == "stall"}
    frame = run.episodes
    part = frame[(frame["policy"] == "planfence") & (frame["keys"] == 128)]
    per_offset = part.groupby("trace_offset_s")["stall_ms_per_action"].median()
    assert d5[("planfence", "128")].testbed == pytest.approx(float(np.median(per_offset)))
    assert d5[("planfence", "128")].episodes == 27
    # D.9 keeps the offset: one cell per (keys, offset)
    d9 = [r for r in rows if r.cell.table == "D.9" and r.cell.column == "stall"]
    assert len(d9) == 12
    five = next(r for r in d9 if r.cell.setting("trace_offset_s") == "5"
                and r.cell.setting("keys") == "8" and r.cell.setting("policy") == "planfence")
    assert five.testbed == pytest.approx(_median(frame[frame["keys"] == 8],
                                                 policy="planfence", trace_offset_s=5.0))


def test_no_comparable_cell_is_one_line(tmp_path: Path) -> None:
    short = _run("quick", [{"policy": ["planfence"], "units": [24],
                            "connection": ["reuse"]}], tmp_path)
    assert beside(short) == []
    assert paper_table(short) is None
    assert "none of this run's cells" in no_match_line(short)
    artifact = _run("artifact", [{"policy": ["planfence"]}], tmp_path)
    assert paper_table(artifact) is None
    assert no_match_line(artifact) == ("No comparable cell: the paper prints no table "
                                       "numbers for the artifact study.")


# --- single-action trials and live tasks ------------------------------------------------------

CELL: dict[str, Any] = {"campaign": "handoff", "network": "loopback", "backend": "none",
                        "trace_offset_s": 0.0, "connection": "fresh", "agents": 5, "keys": 8,
                        "deps": 1, "rho": 4.0, "tier": "compact", "units": 64, "batch": 1}


def _trials(kind: str, campaign: str, specs: list[dict[str, Any]]) -> Run:
    episodes, actions = [], []
    for n, spec in enumerate(specs):
        spec = dict(spec)
        aborted = spec.pop("aborted", False)
        action = spec.pop("action", {})
        study = {k: v for k, v in spec.items() if k != "policy"}
        key = f"{spec['policy']}-{'-'.join(map(str, study.values()))}/t{n:02d}"
        episodes.append({**CELL, "campaign": campaign, "episode": key, "cell": key[:-4],
                         "policy": spec["policy"], "family": "reservation",
                         "template": f"reservation-{n:02d}", "scheduled_actions": 1,
                         "attempted_actions": 0 if aborted else 1, "aborted": aborted,
                         "abort_reason": "initialization: RpcTimeout" if aborted else None,
                         "stall_ms_per_action": 1.0, "kib_per_action": 1.0, **study})
        if not aborted:
            actions.append({**CELL, "campaign": campaign, "episode": key, "cell": key[:-4],
                            "policy": spec["policy"], "action": "act000", "replans": 0,
                            "block_reason": "", "invalid": False, "outcome": "released",
                            **study, **action})
    ep, ac = pd.DataFrame(episodes), pd.DataFrame(actions)
    manifest = {"campaign": campaign, "config": {"kind": kind}}
    return Run(Path("."), manifest, ac, with_action_counts(ep, ac))


def test_handoff_trials_count_as_the_paper_does() -> None:
    handoff = {"scenario": "handoff"}
    specs: list[dict[str, Any]] = (
        [{"policy": "planfence", **handoff, "action": {"replans": 1}}] * 3
        + [{"policy": "planfence", **handoff, "aborted": True}]
        + [{"policy": "session_read_set", **handoff, "action": {"invalid": True}}] * 2)
    rows = beside(_trials("handoff", "handoff", specs))
    got = {(r.cell.setting("policy"), r.cell.column): r for r in rows}
    planfence = ("planfence", "detected")
    assert got[planfence].testbed == (3, 4)  # out of the scheduled trials, as 29/30
    assert got[planfence].tables == ["G.1", "1a"]
    assert got[("planfence", "infra")].testbed == 1.0
    assert got[("planfence", "invalid/issued")].testbed == (0, 3)
    assert got[("session_read_set", "invalid/issued")].testbed == (2, 2)
    assert got[("session_read_set", "valid_completion/scheduled")].testbed == (0, 2)


def test_replanning_trials_and_live_tasks() -> None:
    study = {"replan_delay_s": 0.0, "update_rate_per_s": 2.0, "update_target": "relevant"}
    specs = ([{"policy": "planfence", **study, "action": {"trial_outcome": "complete"}}] * 2
             + [{"policy": "planfence", **study,
                 "action": {"trial_outcome": "block", "outcome": "blocked"}}])
    rows = beside(_trials("replanning", "replanning", specs))
    got = {r.cell.column: r for r in rows}
    assert got["complete/scheduled"].testbed == (2, 3)
    assert got["block"].testbed == 1.0
    assert got["gap"].testbed == 0.0
    assert got["complete/scheduled"].ratio == pytest.approx((2 / 3) / (24 / 30))

    live = {"executor_inputs": "local", "overlap": "none"}
    tasks = ([{"policy": "planfence", **live,
               "action": {"task_success": True, "replans": 1, "primary_outcome": "correct",
                          "redundant_auditor_actions": 1}}] * 2
             + [{"policy": "planfence", **live,
                 "action": {"task_success": False, "primary_outcome": "obsolete",
                            "invalid": True, "redundant_auditor_actions": 0}}])
    rows = beside(_trials("live", "live", tasks))
    got = {r.cell.column: r for r in rows}
    assert got["task_success/scheduled"].testbed == (2, 3)
    assert got["invalid_primary/scheduled"].testbed == (1, 3)
    assert got["successful_replans/scheduled"].testbed == (2, 3)
    assert got["redundant_auditor_actions"].testbed == 2.0


# --- in the report ---------------------------------------------------------------------------


def test_the_report_has_the_section_and_its_files(tmp_path: Path) -> None:
    path = make_campaign("primary", [{"policy": ["planfence", "batched_all_key"]}]
                         ).write(tmp_path / "run")
    summary = build_report(path, draws=50)
    assert summary["paper"] == TABLE_NAME
    for ext in ("csv", "md", "tex"):
        assert (path / "tables" / f"{TABLE_NAME}.{ext}").is_file()
    data = pd.read_csv(path / "tables" / f"{TABLE_NAME}.csv")
    assert {"paper_tables", "row", "column", "paper_value", "testbed_value", "ratio"} \
        <= set(data.columns)
    stall = data[(data["row"] == "policy=planfence") & (data["column"] == "stall")]
    assert stall["paper_tables"].tolist() == ["2 D.1 D.2"]
    assert stall["paper_value"].astype(str).tolist() == ["230.8"]
    md = summary["report_md"].read_text()
    html = summary["report_html"].read_text()
    assert "## The paper beside this run" in md
    assert "| Paper | Testbed |" in md
    assert md.index("## The paper beside this run") < md.index("## Figures")
    assert "<h2>The paper beside this run</h2>" in html


def test_a_report_without_a_comparable_cell_says_so_in_one_line(tmp_path: Path) -> None:
    path = make_campaign("quick", [{"policy": ["planfence"], "units": [24]}]
                         ).write(tmp_path / "run")
    summary = build_report(path, draws=50)
    assert summary["paper"] is None
    assert not (path / "tables" / f"{TABLE_NAME}.csv").exists()
    md = summary["report_md"].read_text()
    section = md.split("## The paper beside this run\n\n", 1)[1].split("\n\n", 1)[0]
    assert section.startswith("No comparable cell:")
    assert "\n" not in section
