"""Claims: the numbers a README states about reference runs, checked against their data.

Rules of this module:

1. A claims file (``results/claims.toml``) lists ``[[claim]]`` entries: ``text`` is a
   passage of the README with the numbers it claims in square brackets (``PlanFence
   [1352] ms/action``), ``run`` the reference run (a directory under results/) and
   ``expr`` a Python expression over that run's data whose value (a number, or a list
   with one number per bracket, in order) must round to what the README writes. The
   README must contain the passage with the brackets removed (line breaks and runs of
   spaces count as one space, so a passage survives the README being reflowed).
2. A number matches when it is within half a unit of its last written digit (``1352``:
   0.5; ``2.6``: 0.05), or within ``tol`` if the claim gives one. Thousands separators
   and a trailing ``%`` are part of how a number is written, not of its value.
3. ``[[given]]`` entries mark numbers that are not measurements of a reference run
   (the paper's figures, configuration values, another document's): the same bracket
   syntax, a ``why`` and no expression. ``checked_sections`` lists README sections
   (their headings) in which every number must be covered by a claim or a given, after
   the labels that :data:`LABEL_BEFORE` and :data:`LABEL_AFTER` recognise (``rho = 4``,
   ``30 templates``, ``D.7``); ``heading#N`` names list item N of a section. A given
   that copies or derives the paper's numbers names them in ``paper``, one reference
   per bracket into ``testbed/report/paper_numbers.csv``
   (:func:`testbed.report.paper.reference_value`), and each must round to what the
   README writes (rule 2).
4. Expressions see the run's frames ``e`` (episodes, with the report's derived counts)
   and ``a`` (actions) and the helpers of :class:`Scope`: filters by column
   (``E(policy="planfence", network="att")``), the report's statistics (cell medians
   over templates, paired two-stage changes with the report's seed and draws, medians
   of per-template ratios), ``runs(name)`` for claims that span several runs,
   ``decomposition(...)`` for the cells of the table "Stall measured vs predicted from
   counted rounds" and ``read_json(path)`` for a benchmark's output kept under results/. They
   only read (rule 10 of STYLE: analysis never rewrites raw results).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.report.decomposition import decomposition
from testbed.report.load import Run, load_run
from testbed.report.stats import (
    DEFAULT_DRAWS,
    compare,
    cost_episodes,
    paired,
    ratio_median,
    row_median,
)

NUMBER = re.compile(r"(?<![\w.])[-+]?\d(?:[\d,]*\d)?(?:\.\d+)?%?")
BRACKET = re.compile(r"\[([^\[\]]+)\]")
STRATA = ("trace_offset_s",)
LABEL_BEFORE = re.compile(
    r"(?:\b(?:rho|delta|lambda|d|K|N|T|p|r)\s*(?:=|<=|>=|<|>)\s*|\b(?:[Ff]indings?|[Tt]ables?|"
    r"[Ff]igures?|appendix|issue|[Bb]atch(?:es)?)\s+|[A-Z]\.|[a-z]-)$")
LABEL_AFTER = re.compile(
    r"^(?:\s*(?:templates?|schedules|keys|agents|work units|lanes|trials per)\b|-template|"
    r"\.[A-Za-z0-9])")
"""Numbers that name something rather than measure it (rule 3): ``rho = 4``,
``finding 10``, ``D.7``, ``30 templates``; list numbers, dates and inline code too."""


@dataclass(frozen=True)
class Claim:
    text: str
    expr: str = ""
    run: str = ""
    tol: float | None = None
    why: str = ""  # a given: why it is not checked against data
    #: A given's paper references, one per bracket (testbed.report.paper.reference_value)
    paper: tuple[str, ...] = ()

    @property
    def plain(self) -> str:
        """The README passage (brackets removed, whitespace collapsed)."""
        return _collapse(BRACKET.sub(lambda m: m.group(1), self.text))

    @property
    def written(self) -> list[str]:
        """The claimed numbers as the README writes them."""
        return [m.group(1) for m in BRACKET.finditer(self.text)]


@dataclass
class ClaimsFile:
    claims: list[Claim]
    given: list[Claim]
    checked_sections: list[str] = field(default_factory=list)


def load_claims(path: Path) -> ClaimsFile:
    body = tomllib.loads(path.read_text())
    claims = [Claim(text=c["text"], expr=c["expr"], run=c.get("run", ""),
                    tol=c.get("tol")) for c in body.get("claim", [])]
    given = [Claim(text=g["text"], why=g["why"], paper=tuple(g.get("paper", ())))
             for g in body.get("given", [])]
    return ClaimsFile(claims, given, list(body.get("checked_sections", [])))


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def normalized(readme: str) -> tuple[str, list[int]]:
    """The README with whitespace collapsed, and for each of its characters the offset
    in the original."""
    out: list[str] = []
    where: list[int] = []
    for i, ch in enumerate(readme):
        if ch.isspace():
            if out and out[-1] == " ":
                continue
            ch = " "
        out.append(ch)
        where.append(i)
    return "".join(out), where


def contains(readme: str, claim: Claim) -> bool:
    return claim.plain in normalized(readme)[0]


def parse_number(text: str) -> tuple[float, float]:
    """The value a README number writes and half a unit of its last digit (rule 2)."""
    core = text.replace(",", "").rstrip("%").lstrip("+")
    decimals = len(core.split(".", 1)[1]) if "." in core else 0
    return float(core), 0.5 * 10.0 ** -decimals


# --- the expression scope (rule 4) ----------------------------------------------------


@cache
def _load(root: Path, name: str) -> Run:
    return load_run(root / name)


def _select(frame: pd.DataFrame, filters: dict[str, Any]) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for column, value in filters.items():
        if isinstance(value, (list, tuple, set)):
            mask &= frame[column].isin(list(value))
        elif value is None:
            mask &= frame[column].isna()
        else:
            mask &= frame[column] == value
    return frame.loc[mask]


@cache
def _all_episodes(root: Path) -> pd.DataFrame:
    frames = []
    for path in sorted(root.glob("*/episodes.parquet")):
        frame = _load(root, path.parent.name).episodes.copy()
        frame["run"] = path.parent.name
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


@cache
def _rerun_pairs(root: Path) -> pd.DataFrame:
    episodes = _all_episodes(root)
    live = [name for name in episodes["run"].unique()
            if _load(root, name).manifest.get("config", {}).get("kind") == "live"]
    # live studies share episode keys and schedules with each other, but their stall
    # is a model's time, not a cost to compare across runs
    costs = cost_episodes(episodes[~episodes["run"].isin(live)])
    side = costs[["episode", "schedule_digest", "run", "policy", "network",
                  "stall_ms_per_action", "kib_per_action"]]
    both = side.merge(side, on=["episode", "schedule_digest"], suffixes=("_x", "_y"))
    both = both[both["run_x"] < both["run_y"]]
    pairs = pd.DataFrame({
        "policy": both["policy_x"], "network": both["network_x"],
        "runs": list(zip(both["run_x"], both["run_y"], strict=True)),
        "a": both["stall_ms_per_action_x"], "b": both["stall_ms_per_action_y"],
        "same_bytes": both["kib_per_action_x"] == both["kib_per_action_y"]})
    high = pairs[["a", "b"]].max(axis=1)
    pairs["deviation"] = high / pairs[["a", "b"]].min(axis=1) - 1
    pairs["ratio"] = pairs["a"] / pairs["b"]
    return pairs.reset_index(drop=True)


_DECOMPOSITIONS: OrderedDict[int, tuple[Run, pd.DataFrame]] = OrderedDict()
#: Runs whose decomposition is kept (the claims of one run ask for it several times;
#: ``testbed reproduce`` evaluates claims on hundreds of resampled runs).
_DECOMPOSITIONS_KEPT = 8


def _decomposition(run: Run) -> pd.DataFrame:
    """The run's decomposition cells, computed once per loaded run (a few runs kept)."""
    held = _DECOMPOSITIONS.get(id(run))
    if held is None or held[0] is not run:
        held = (run, pd.DataFrame([row.record() for row in decomposition(run)]))
        _DECOMPOSITIONS[id(run)] = held
        while len(_DECOMPOSITIONS) > _DECOMPOSITIONS_KEPT:
            _DECOMPOSITIONS.popitem(last=False)
    _DECOMPOSITIONS.move_to_end(id(run))
    return held[1]


class Scope:
    """What an expression sees: one run's frames and the report's statistics."""

    def __init__(self, root: Path, run: str) -> None:
        self.root = root
        self.run = _load(root, run) if run else None

    def runs(self, name: str) -> Run:
        return _load(self.root, name)

    def all_episodes(self) -> pd.DataFrame:
        """Every reference run's episodes, with a ``run`` column."""
        return _all_episodes(self.root)

    def rerun_pairs(self, **filters: Any) -> pd.DataFrame:
        """Same-key episodes of two reference runs, live studies aside (every pair of
        runs that hold the key, same schedule digest, neither aborted): columns ``policy``, ``runs``,
        ``a``, ``b`` (stall per action), ``same_bytes``, ``ratio`` (a / b) and
        ``deviation`` (larger / smaller - 1)."""
        pairs = _rerun_pairs(self.root)
        return _select(pairs, filters).reset_index(drop=True)

    def sessions(self) -> list[dict[str, Any]]:
        """The run's sessions from its manifest: ``jobs``, ``minutes`` (NaN for a
        session that recorded no end: killed) and ``status``."""
        assert self.run is not None, "this claim names no run"
        out = []
        for session in self.run.manifest.get("sessions", []):
            minutes = float("nan")
            if "ended_at" in session:
                start = pd.Timestamp(session["started_at"])
                minutes = (pd.Timestamp(session["ended_at"]) - start).total_seconds() / 60
            out.append({"jobs": session.get("jobs"), "minutes": minutes,
                        "status": session.get("status")})
        return out

    def read_json(self, name: str) -> Any:
        """A JSON file under the results root (a benchmark's output, e.g.
        ``transfer/transfer.json``)."""
        return json.loads((self.root / name).read_text())

    def cell_medians(self, metric: str = "stall_ms_per_action", **filters: Any) -> pd.Series:
        """Every reference run's cell medians over templates (index: run, cell) of the
        cells that match ``filters`` (``run=[...]`` picks runs)."""
        frame = _select(cost_episodes(self.all_episodes()), filters)
        return frame.groupby(["run", "cell"])[metric].median()

    def decomposition(self, run: str = "", **filters: Any) -> pd.DataFrame:
        """The cells of the run's (or RUN's) table "Stall measured vs predicted from
        counted rounds" (``testbed.report.decomposition``, one row per cell, the CSV's
        columns) that match ``filters``."""
        if run:
            frame = _decomposition(_load(self.root, run))
        else:
            assert self.run is not None, "this claim names no run"
            frame = _decomposition(self.run)
        return _select(frame, filters).reset_index(drop=True)

    def E(self, **filters: Any) -> pd.DataFrame:
        assert self.run is not None, "this claim names no run"
        return _select(self.run.episodes, filters)

    def A(self, **filters: Any) -> pd.DataFrame:
        assert self.run is not None, "this claim names no run"
        return _select(self.run.actions, filters)

    def median(self, metric: str, **filters: Any) -> float:
        """A cell's median over templates (of per-offset medians, as the report)."""
        return row_median(self.E(**filters), metric, STRATA)

    def stall(self, **filters: Any) -> float:
        return self.median("stall_ms_per_action", **filters)

    def kib(self, **filters: Any) -> float:
        return self.median("kib_per_action", **filters)

    def pairs(self, a: Any, b: Any, *, metric: str = "stall_ms_per_action",
              vary: str = "policy", **filters: Any) -> pd.DataFrame:
        frame = self.E(**filters)
        strata = self.run.cell_columns() if self.run is not None else []
        return paired(frame, vary=vary, a=a, b=b, metric=metric, strata=strata)

    def change(self, a: Any, b: Any, **kw: Any) -> list[float]:
        """Paired change of a against b in percent: [change, low, high] (the report's
        two-stage bootstrap, its default draws and seed)."""
        result = compare(self.pairs(a, b, **kw), draws=DEFAULT_DRAWS, seed=0)
        assert result is not None, f"no pairs for {a} vs {b} {kw}"
        return [100 * result.change, 100 * result.change_low, 100 * result.change_high]

    def ratio(self, a: Any, b: Any, **kw: Any) -> float:
        """The paper's statistic: the median of per-template ratios a / b."""
        result = ratio_median(self.pairs(a, b, **kw))
        assert result is not None, f"no pairs for {a} vs {b} {kw}"
        return result.median

    def namespace(self) -> dict[str, Any]:
        names: dict[str, Any] = {n: getattr(self, n) for n in (
            "E", "A", "median", "stall", "kib", "pairs", "change", "ratio", "runs",
            "all_episodes", "rerun_pairs", "cell_medians", "read_json", "sessions",
            "decomposition")}
        if self.run is not None:
            names.update(e=cost_episodes(self.run.episodes), a=self.run.actions,
                         episodes=self.run.episodes)
        names.update(np=np, pd=pd, math=math, itertools=itertools, len=len, sum=sum,
                     min=min, max=max, round=round, sorted=sorted, abs=abs, int=int,
                     float=float, list=list, set=set, zip=zip, range=range, any=any,
                     all=all)
        return names


def evaluate(claim: Claim, root: Path, scope: Scope | None = None) -> list[float]:
    """The claim's expression, as a list of numbers (one per bracket); ``scope`` gives
    it other data than the run under ``root`` (``testbed reproduce``: a rerun)."""
    scope = scope if scope is not None else Scope(root, claim.run)
    value = eval(claim.expr, {"__builtins__": {}, **scope.namespace()})
    values = list(value) if isinstance(value, (list, tuple, np.ndarray, pd.Series)) else [value]
    return [float(v) for v in values]


def mismatches(claim: Claim, values: Sequence[float]) -> list[str]:
    """What the README writes against what the data says (rule 2); empty if it holds."""
    written = claim.written
    if len(values) != len(written):
        return [f"{len(written)} number(s) in the text, {len(values)} from the expression"]
    out = []
    for shown, value in zip(written, values, strict=True):
        expected, half_unit = parse_number(shown)
        tol = claim.tol if claim.tol is not None else half_unit
        if not (math.isfinite(value) and abs(value - expected) <= tol + 1e-9):
            out.append(f"README says {shown}, the data {value:.4g}")
    return out


# --- coverage (rule 3) --------------------------------------------------------------------


def sections(readme: str) -> dict[str, tuple[int, int]]:
    """Heading -> (start, end) offsets of its section (down to the next heading)."""
    heads = [(m.start(), m.group(2).strip()) for m in
             re.finditer(r"^(#+) (.+)$", readme, flags=re.MULTILINE)]
    ends = [start for start, _ in heads[1:]] + [len(readme)]
    out = {title: (start, end) for (start, title), end in zip(heads, ends, strict=True)}
    for title, (start, end) in list(out.items()):  # "heading#N": list item N
        items = list(re.finditer(r"^(\d+)\. ", readme[start:end], flags=re.MULTILINE))
        for item, after in zip(items, [*items[1:], None][:len(items)], strict=True):
            stop = start + after.start() if after is not None else end
            out[f"{title}#{item.group(1)}"] = (start + item.start(), stop)
    return out


def covered_spans(readme: str, entries: Iterable[Claim]) -> list[tuple[int, int]]:
    """Offsets in the README of the bracketed numbers of every entry's passage."""
    norm, origin = normalized(readme)
    spans = []
    for entry in entries:
        marked = _collapse(entry.text)
        plain = entry.plain
        if not plain:
            continue
        where = norm.find(plain)
        while where >= 0:
            shift = 0
            for match in BRACKET.finditer(marked):
                start = where + match.start() - shift
                end = start + len(match.group(1))
                spans.append((origin[start], origin[end - 1] + 1))
                shift += 2
            where = norm.find(plain, where + 1)
    return spans


def is_label(readme: str, start: int, end: int) -> bool:
    """A number that names something (rule 3), not one a run measured."""
    line_start = readme.rfind("\n", 0, start) + 1
    before, after = readme[line_start:start], readme[end:end + 24]
    token = readme[start:end]
    if before.count("`") % 2 == 1:
        return True  # inside inline code (a file or a setting)
    if before.strip() == "" and after.startswith(". "):
        return True  # a numbered list item
    if (re.fullmatch(r"20\d\d", token) and after.startswith("-")) or re.search(
            r"20\d\d-(?:\d\d-)?$", before) or (re.fullmatch(r"\d\d", token) and (
            re.match(r"-\d\d\b", after) or re.search(r"\b\d\d-$", before))):
        return True  # a date (2026-12-01, or 12-01 in a table)
    wider = re.sub(r"\s+", " ", readme[max(0, start - 40):start])  # across a line break
    return bool(LABEL_BEFORE.search(wider) or LABEL_AFTER.match(after))


def uncovered(readme: str, claims: ClaimsFile) -> list[str]:
    """Numbers in the checked sections that no claim or given covers (with context)."""
    spans = covered_spans(readme, [*claims.claims, *claims.given])
    bounds = sections(readme)
    out = []
    for title in claims.checked_sections:
        if title not in bounds:
            out.append(f"section {title!r}: not in the README")
            continue
        lo, hi = bounds[title]
        for match in NUMBER.finditer(readme, lo, hi):
            start, end = match.span()
            end -= match.group(0).endswith("%")  # the README's unit, not the number
            if any(s <= start and end <= e for s, e in spans):
                continue
            if is_label(readme, start, end):
                continue
            context = readme[max(0, start - 40):end + 20].replace("\n", " ")
            out.append(f"{title}: {match.group(0)!r} in ...{context}...")
    return out
