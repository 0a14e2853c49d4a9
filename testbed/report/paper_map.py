"""Which of the paper's table cells a run compares with, and the run's value of each.

The mapping is data: :data:`TABLE_SPECS` gives each paper table the kind of run it
describes and the settings all its cells share, :data:`STUDIES` the tables each study
(campaign name) reproduces. A campaign that is not a known study is compared with every
table of its kind, first table first, one paper cell per testbed selection.
:func:`beside` computes, for each comparable cell, the run's value of the paper's
statistic (:data:`STATISTICS`, one per column whatever the study: a cost is the median
over templates, as in the report's tables) and the ratio testbed / paper.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from testbed.report import slicing
from testbed.report.load import Run
from testbed.report.paper import DIMENSIONS, NUMERIC, PaperCell, parse_settings, shipped
from testbed.report.stats import RowSummary, summarise
from testbed.report.table_common import strata
from testbed.report.tables_trials import trial_kind
from testbed.report.tabular import fmt
from testbed.results.schema import STRATUM_COLUMNS

# --- which tables a run compares with (data) --------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    """What the cells of one paper table share."""

    kind: str  # the run kind it describes (testbed.report.tables_trials.trial_kind)
    fixed: tuple[tuple[str, str], ...]
    spans: tuple[str, ...] = ()  # dimensions a cell spans (median of per-stratum medians)


_DEFAULTS = ("agents=5 keys=8 deps=1 units=64 connection=fresh trace_offset_s=0 "
             "tier=compact")
# table | kind of run | settings every cell of the table shares | dimensions a cell spans
_TABLE_ROWS = f"""
1a   | handoff    | network=loopback |
G.1  | handoff    | network=loopback |
F.1  | replanning | network=loopback |
1b   | live       | executor_inputs=local |
C.2  | live       | |
2    | episodes   | network=att rho=4 {_DEFAULTS} |
D.1  | episodes   | network=att rho=4 {_DEFAULTS} |
D.2  | episodes   | network=att {_DEFAULTS} |
D.3  | episodes   | network=att rho=4 keys=8 deps=1 units=64 connection=fresh trace_offset_s=0 tier=compact |
D.4  | episodes   | network=att rho=4 agents=5 keys=8 deps=1 connection=fresh trace_offset_s=0 tier=compact |
D.7  | episodes   | network=att {_DEFAULTS} |
H.1  | episodes   | network=att agents=5 deps=1 units=64 trace_offset_s=0 tier=compact |
D.6  | episodes   | network=att rho=4 agents=5 keys=8 units=64 connection=fresh trace_offset_s=0 tier=compact |
D.5  | episodes   | rho=4 agents=5 deps=1 units=64 connection=fresh tier=compact | trace_offset_s
D.9  | episodes   | network=att rho=4 agents=5 deps=1 units=64 connection=fresh tier=compact |
D.8  | episodes   | network=att rho=4 agents=5 keys=8 deps=1 units=64 trace_offset_s=0 tier=compact |
D.10 | selector   | |
"""
# study (campaign name) | the paper's tables it reproduces (none: no table with numbers)
_STUDY_ROWS = """
primary           | 2 D.1 D.2
rates             | D.2 D.7
d7                | D.7
scope             | D.5 D.9
density           | D.6
reuse             | H.1
teams             | D.3
horizon           | D.4
batches           | D.8
artifact          |
replanning        | F.1
handoff           | G.1 1a
live              | 1b
live_fresh_before | C.2
live_overlap      |
"""


def _table_specs() -> dict[str, TableSpec]:
    specs = {}
    for line in filter(None, (x.strip() for x in _TABLE_ROWS.splitlines())):
        table, kind, fixed, spans = (part.strip() for part in line.split("|"))
        specs[table] = TableSpec(kind, parse_settings(fixed) if fixed else (),
                                 tuple(spans.split()))
    return specs


def _studies() -> dict[str, tuple[str, ...]]:
    out = {}
    for line in filter(None, (x.strip() for x in _STUDY_ROWS.splitlines())):
        study, tables = (part.strip() for part in line.split("|"))
        out[study] = tuple(tables.split())
    return out


#: Every paper table of the file, in the order a campaign that is not a known study is
#: compared with them.
TABLE_SPECS: dict[str, TableSpec] = _table_specs()
#: Study (campaign name) -> the tables it reproduces.
STUDIES: dict[str, tuple[str, ...]] = _studies()
# --- a run's frames, one per kind ---------------------------------------------------------

_TRIAL_COLUMNS = ("episode", "trial_outcome", "outcome", "invalid", "replans",
                  "block_reason")
_LIVE_COLUMNS = ("episode", "outcome", "invalid", "replans", "primary_outcome",
                 "redundant_auditor_actions", "task_success")


def _frame(run: Run, kind: str) -> pd.DataFrame:
    """One row per episode (cost studies) or per trial / task with its action."""
    if kind == "episodes":
        return run.episodes
    wanted = _LIVE_COLUMNS if kind == "live" else _TRIAL_COLUMNS
    actions = run.actions[[c for c in wanted if c in run.actions]]
    frame = run.episodes.merge(actions, on="episode", how="left")
    if kind == "live":
        for column, default in (("executor_inputs", "local"), ("overlap", "none")):
            frame[column] = frame[column].fillna(default) if column in frame else default
        frame = frame[frame["overlap"] == "none"]
    return frame


def _matches(series: pd.Series, name: str, value: str) -> pd.Series:
    if name in NUMERIC:
        numbers = pd.to_numeric(series, errors="coerce").astype(float)
        return (numbers - float(value)).abs() < 1e-9
    return series.astype(str) == value


def _default(name: str) -> str | None:
    preferred = slicing.PREFERRED.get(name)
    if preferred is None:
        return None
    return DIMENSIONS[name](str(preferred)) if name in DIMENSIONS else str(preferred)


def select(frame: pd.DataFrame, settings: Iterable[tuple[str, str]],
           spans: Sequence[str] = ()) -> pd.DataFrame:
    """The rows holding ``settings``, with every other stratum column pinned to one
    value as the report's tables pin it (its preferred value, else the most common),
    except the columns in ``spans``. A setting on a column the run does not have holds
    only if it is that column's default."""
    chosen = frame
    named = set()
    for name, value in settings:
        named.add(name)
        if name not in chosen or chosen[name].isna().all():
            if _default(name) != value:
                return chosen.iloc[0:0]
            continue
        chosen = chosen[_matches(chosen[name], name, value)]
    for column in STRATUM_COLUMNS:
        if column in named or column in spans or column not in chosen:
            continue
        if chosen[column].dropna().nunique() <= 1:
            continue
        pinned = slicing.pinned_value(chosen, column)
        text = slicing.number(pinned) if column in NUMERIC else str(pinned)
        chosen = chosen[_matches(chosen[column], column, text)]
    return chosen


# --- the statistics (one per column, whatever the study) -------------------------------

Value = float | tuple[int, int]
Statistic = Callable[[pd.DataFrame], Value | None]


def _one_policy(frame: pd.DataFrame) -> bool:
    return "policy" in frame and frame["policy"].nunique() == 1


def _summary(frame: pd.DataFrame) -> RowSummary | None:
    return summarise(frame, strata()) if _one_policy(frame) else None


def _from_summary(get: Callable[[RowSummary], Value]) -> Statistic:
    def statistic(frame: pd.DataFrame) -> Value | None:
        summary = _summary(frame)
        if summary is None or summary.episodes == 0:
            return None
        value = get(summary)
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value
    return statistic


PAIR_POLICIES = ("planfence", "batched_all_key")
PAIR_COLUMNS = ("planfence_vs_batched", "reduction")


def _pair(change: Callable[[float, float], float]) -> Statistic:
    """PlanFence against batched all-key in one selection (both policies)."""
    def statistic(frame: pd.DataFrame) -> Value | None:
        medians = []
        for policy in PAIR_POLICIES:
            mine = frame[frame["policy"] == policy]
            if mine.empty:
                return None
            medians.append(summarise(mine, strata()).stall_ms)
        planfence, batched = medians
        if not (math.isfinite(planfence) and math.isfinite(batched)) or batched == 0:
            return None
        return change(planfence, batched)
    return statistic


def _trials(test: Callable[[pd.DataFrame], pd.Series], *,
            of_scheduled: bool = True) -> Statistic:
    """A count over one policy's trials or tasks (out of all of them, or a plain count)."""
    def statistic(frame: pd.DataFrame) -> Value | None:
        if not _one_policy(frame) or frame.empty:
            return None
        hits = int(test(frame).fillna(False).astype(bool).sum())
        return (hits, len(frame)) if of_scheduled else float(hits)
    return statistic


def _done(frame: pd.DataFrame) -> pd.Series:
    return ~frame["aborted"].astype(bool)


def _issued(frame: pd.DataFrame) -> pd.Series:
    return _done(frame) & (frame["outcome"] == "released")


def _trial_invalid(frame: pd.DataFrame) -> Value | None:
    if not _one_policy(frame) or frame.empty:
        return None
    issued = _issued(frame)
    invalid = issued & frame["invalid"].fillna(False).astype(bool)
    return int(invalid.sum()), int(issued.sum())


def _outcome(name: str) -> Callable[[pd.DataFrame], pd.Series]:
    return lambda f: _done(f) & (f["trial_outcome"] == name)


def _detected(frame: pd.DataFrame) -> pd.Series:
    stale = frame["block_reason"].fillna("").astype(str).str.startswith("stale")
    return _done(frame) & ((frame["replans"].fillna(0) > 0) | stale)


def _redundant(frame: pd.DataFrame) -> Value | None:
    if not _one_policy(frame) or frame.empty:
        return None
    return float(frame["redundant_auditor_actions"].fillna(0).sum())


#: column -> the statistic it holds, per kind of run (a column a kind lacks: no match).
STATISTICS: dict[str, dict[str, Statistic]] = {
    "episodes": {
        "stall": _from_summary(lambda s: s.stall_ms),
        "stall_q1": _from_summary(lambda s: s.stall_q1_ms),
        "stall_q3": _from_summary(lambda s: s.stall_q3_ms),
        "traffic": _from_summary(lambda s: s.kib),
        "connections": _from_summary(lambda s: s.connections),
        "invalid/issued": _from_summary(lambda s: (s.invalid, s.issued)),
        "available/scheduled": _from_summary(lambda s: (s.available, s.scheduled)),
        "valid/scheduled": _from_summary(lambda s: (s.valid, s.scheduled)),
        "planfence_vs_batched": _pair(lambda pf, bk: 100 * (pf / bk - 1)),
        "reduction": _pair(lambda pf, bk: 100 * (1 - pf / bk)),
    },
    "replanning": {
        "complete/scheduled": _trials(_outcome("complete")),
        "block": _trials(_outcome("block"), of_scheduled=False),
        "gap": _trials(_outcome("gap"), of_scheduled=False),
        "infra": _trials(lambda f: ~_done(f), of_scheduled=False),
    },
    "handoff": {
        "detected": _trials(_detected),
        "invalid/issued": _trial_invalid,
        "valid_completion/scheduled": _trials(
            lambda f: _issued(f) & ~f["invalid"].fillna(False).astype(bool)),
        "infra": _trials(lambda f: ~_done(f), of_scheduled=False),
    },
    "live": {
        "task_success/scheduled": _trials(lambda f: f["task_success"]),
        "invalid_primary/scheduled": _trials(
            lambda f: f["invalid"].fillna(False).astype(bool) & (f["outcome"] == "released")),
        "successful_replans/scheduled": _trials(
            lambda f: (f["replans"].fillna(0) > 0) & (f["outcome"] == "released")),
        "redundant_auditor_actions": _redundant,
        "correct_primary/scheduled": _trials(lambda f: f["primary_outcome"] == "correct"),
    },
}

# --- the mapping ----------------------------------------------------------------------


@dataclass
class Beside:
    """A paper cell (or several equal ones) beside the run's value of its statistic."""

    tables: list[str]
    cell: PaperCell
    testbed: Value
    episodes: int
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """testbed / paper (of the shares for counts out of a denominator)."""
        paper = self.cell.share
        if isinstance(self.testbed, tuple):
            hits, total = self.testbed
            mine = hits / total if total else math.nan
        else:
            mine = self.testbed
        if not paper or not math.isfinite(paper) or not math.isfinite(mine):
            return math.nan
        return mine / paper

    @property
    def testbed_number(self) -> float:
        return float(self.testbed[0] if isinstance(self.testbed, tuple) else self.testbed)

    @property
    def testbed_text(self) -> str:
        if isinstance(self.testbed, tuple):
            return f"{self.testbed[0]}/{self.testbed[1]}"
        return fmt(self.testbed, self.cell.decimals)


def study_tables(run: Run) -> tuple[tuple[str, ...], bool]:
    """The tables a run is compared with, and whether its campaign is a known study."""
    kind = trial_kind(run)
    if run.campaign in STUDIES:
        return STUDIES[run.campaign], True
    return tuple(t for t, spec in TABLE_SPECS.items() if spec.kind == kind), False


def beside(run: Run, cells: Sequence[PaperCell] | None = None) -> list[Beside]:
    """Every paper cell the run holds, with the run's value of the same statistic.

    A known study is compared with its tables (:data:`STUDIES`); equal paper cells that
    select the same episodes are one row naming every table. Any other campaign is
    compared with every table of its kind, and a selection keeps its first paper cell
    (in :data:`TABLES` order).
    """
    pool = cells if cells is not None else shipped()
    tables, known = study_tables(run)
    kind = trial_kind(run)
    frames: dict[str, pd.DataFrame] = {}
    out: list[Beside] = []
    index: dict[tuple[tuple[Any, ...], str], list[Beside]] = {}
    for table in tables:
        spec = TABLE_SPECS[table]
        if spec.kind != kind or spec.kind not in STATISTICS:
            continue
        if kind not in frames:
            frames[kind] = _frame(run, kind)
        frame = frames[kind]
        for cell in (c for c in pool if c.table == table):
            statistic = STATISTICS[kind].get(cell.column)
            if statistic is None:
                continue
            settings = dict(spec.fixed)
            settings.update(cell.row)
            chosen = select(frame, settings.items(), spec.spans)
            if cell.column in PAIR_COLUMNS:
                chosen = chosen[chosen["policy"].isin(PAIR_POLICIES)]
            if chosen.empty:
                continue
            try:
                value = statistic(chosen)
            except KeyError:  # the run lacks a column this statistic reads
                continue
            if value is None:
                continue
            key = (tuple(chosen.index), cell.column)
            same = index.setdefault(key, [])
            if same and not known:
                continue
            match = next((b for b in same if b.cell.value == cell.value), None)
            if match is not None:
                if table not in match.tables:
                    match.tables.append(table)
                if cell.note and cell.note not in match.notes:
                    match.notes.append(cell.note)
                continue
            row = Beside([table], cell, value, len(chosen), [cell.note] if cell.note else [])
            same.append(row)
            out.append(row)
    return out
