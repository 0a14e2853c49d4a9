"""The paper's table layouts (Table 2, D.1-D.7, D.9, H.1) built from a campaign's results.

Every builder returns the tables the campaign can fill (possibly none): a layout is
written only when the campaign holds the cells it compares. See docs/reports.md for how
to read each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from testbed.report import naming, slicing
from testbed.report.load import CELL_COLUMNS, Run
from testbed.report.stats import Comparison, RowSummary, compare, paired, practical_tie, summarise
from testbed.report.tabular import BEST, LOWER, SECOND, Cell, Table, fmt, pct

STALL, KIB = "stall_ms_per_action", "kib_per_action"


@dataclass(frozen=True)
class Options:
    draws: int
    seed: int


def _strata() -> list[str]:
    return list(CELL_COLUMNS)


def _summary_row(summary: RowSummary) -> dict[str, object]:
    return {
        "episodes": summary.episodes,
        "aborted_episodes": summary.aborted,
        "scheduled": summary.scheduled,
        "available": summary.available,
        "issued": summary.issued,
        "invalid": summary.invalid,
        "valid": summary.valid,
        "stall_ms_median": summary.stall_ms,
        "stall_ms_q1": summary.stall_q1_ms,
        "stall_ms_q3": summary.stall_q3_ms,
        "kib_median": summary.kib,
        "kib_q1": summary.kib_q1,
        "kib_q3": summary.kib_q3,
        "connections_median": summary.connections,
    }


def _with_provenance(run: Run, data: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    data.insert(0, "campaign", run.campaign)
    for column in ("backend", "network"):
        if column in frame and column not in data:
            data.insert(1, column, ", ".join(map(str, slicing.sorted_values(frame, column))))
    return data


def _layout(run: Run, frame: pd.DataFrame, records: list[dict[str, object]],
            **fields: Any) -> Table:
    """A table in one of the paper's layouts: its machine-readable data (one record per
    row, with provenance columns) and its provenance line come from the same slice."""
    return Table(data=_with_provenance(run, pd.DataFrame(records), frame),
                 provenance=slicing.provenance(run.campaign, frame), **fields)


def rank_marks(values: dict[str, float], eligible: set[str]) -> dict[str, str]:
    """Best and second-best (lowest) values among the eligible keys."""
    ranked = sorted(
        (v, k) for k, v in values.items() if k in eligible and pd.notna(v)
    )
    marks: dict[str, str] = {}
    for (_, key), mark in zip(ranked, (BEST, SECOND), strict=False):
        marks[key] = mark
    return marks


def _policy(frame: pd.DataFrame, policy: str) -> pd.DataFrame:
    return frame[frame["policy"] == policy]


def _comparison_text(result: Comparison | None) -> str:
    if result is None:
        return "–"
    text = f"{pct(result.change)} [{pct(result.change_low)}, {pct(result.change_high)}]"
    return text + (" tie" if result.tie else "")


def _compare(
    frame: pd.DataFrame, vary: str, a: object, b: object, metric: str, options: Options
) -> Comparison | None:
    pairs = paired(frame, vary=vary, a=a, b=b, metric=metric, strata=_strata())
    return compare(pairs, draws=options.draws, seed=options.seed)


def _comparison_columns(prefix: str, result: Comparison | None) -> dict[str, object]:
    if result is None:
        return {f"{prefix}_pairs": 0}
    return {
        f"{prefix}_pairs": result.pairs,
        f"{prefix}_diff": result.diff,
        f"{prefix}_diff_low": result.diff_low,
        f"{prefix}_diff_high": result.diff_high,
        f"{prefix}_change": result.change,
        f"{prefix}_change_low": result.change_low,
        f"{prefix}_change_high": result.change_high,
        f"{prefix}_tie": result.tie,
    }


# --- Table 2 and D.1: one row per policy at the headline setting ---------------------------


def policy_tables(run: Run, options: Options) -> list[Table]:
    tables: list[Table] = []
    for network in slicing.networks(run.episodes):
        chosen = slicing.slice_for(run.episodes, free=(), where={"network": network, "rho": 4.0})
        present = naming.ordered(chosen.episodes["policy"].unique())
        if len(present) < 2:
            continue
        headline = [p for p in present if p in naming.TABLE2_POLICIES]
        if len(headline) >= 2 and headline != present:
            tables.append(_policy_table(run, chosen.episodes, headline, f"table2_{network}",
                                        f"Table 2 layout: policies at rho = 4 on {network}",
                                        options))
        tables.append(_policy_table(run, chosen.episodes, present, f"table_d1_{network}",
                                    f"Table D.1 layout: all policies at rho = 4 on {network}",
                                    options))
        if "planfence" in present:
            tables.append(_paired_table(run, chosen.episodes, present, network, options))
    return tables


def _paired_table(
    run: Run, frame: pd.DataFrame, policies: list[str], network: str, options: Options
) -> Table:
    """PlanFence against every other policy of D.1 on paired templates, stall and traffic."""
    rows: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    lower: list[str] = []
    for policy in policies:
        if policy == "planfence":
            continue
        stall = _compare(frame, "policy", "planfence", policy, STALL, options)
        if stall is not None and stall.change < 0 and not stall.tie:
            lower.append(policy)
        kib = _compare(frame, "policy", "planfence", policy, KIB, options)
        rows.append([Cell(naming.display_name(policy)), Cell(naming.category(policy)),
                     Cell(str(stall.pairs if stall else 0)), Cell(_comparison_text(stall)),
                     Cell(_comparison_text(kib))])
        records.append({"policy": policy, "category": naming.category(policy),
                        **_comparison_columns("stall", stall), **_comparison_columns("kib", kib)})
    findings = []
    if lower:
        findings.append("PlanFence's paired median stall is more than 10% below: "
                        + ", ".join(naming.display_name(str(p)) for p in lower) + ".")
    return _layout(run, frame, records,
        name=f"paired_d1_{network}",
        title=f"Paired comparisons at rho = 4 on {network}: PlanFence against each policy",
        header=["Against", "Category", "Paired templates", "Stall change [95% CI]",
                "Traffic change [95% CI]"],
        rows=rows,
        legend="Change = PlanFence median / other median - 1 over templates with identical "
        "schedules (aborted episodes dropped with their pair); 95% two-stage bootstrap "
        "interval; 'tie' marks a difference under 10% of the larger median.",
        findings=findings,
    )


def _policy_table(
    run: Run, frame: pd.DataFrame, policies: list[str], name: str, title: str, options: Options
) -> Table:
    summaries = {p: summarise(_policy(frame, p), _strata()) for p in policies}
    eligible = {p for p, s in summaries.items() if s.safe and naming.category(p) == naming.CURRENT}
    stall_marks = rank_marks({p: s.stall_ms for p, s in summaries.items()}, eligible)
    kib_marks = rank_marks({p: s.kib for p, s in summaries.items()}, eligible)
    rows: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    last_category = ""
    for policy in policies:
        s = summaries[policy]
        cat = naming.category(policy)
        rows.append([
            Cell(cat if cat != last_category else ""),
            Cell(naming.display_name(policy)),
            Cell(f"{s.invalid}/{s.issued}"),
            Cell(f"{s.available}/{s.scheduled}"),
            Cell(fmt(s.stall_ms), stall_marks.get(policy, "")),
            Cell(fmt(s.kib), kib_marks.get(policy, "")),
        ])
        last_category = cat
        records.append({"category": cat, "policy": policy, **_summary_row(s),
                        "stall_mark": stall_marks.get(policy, ""),
                        "kib_mark": kib_marks.get(policy, "")})
    data = _with_provenance(run, pd.DataFrame(records), frame)
    return Table(
        name=name,
        title=title,
        header=["Category", "Method", "Invalid / issued", "Available / scheduled",
                "Stall (ms/action)", "Traffic (KiB/action)"],
        rows=rows,
        data=data,
        provenance=slicing.provenance(run.campaign, frame),
        legend="Bold: lowest, underlined: second lowest among derivation-current policies "
        "with no invalid action and full availability. Costs are medians over templates; "
        "aborted episodes count in the scheduled column but not in the costs.",
        findings=_policy_findings(summaries, eligible, frame, options),
    )


def _policy_findings(
    summaries: dict[str, RowSummary], eligible: set[str], frame: pd.DataFrame, options: Options
) -> list[str]:
    findings: list[str] = []
    safe = sorted((summaries[p].stall_ms, p) for p in eligible if pd.notna(summaries[p].stall_ms))
    if safe:
        best_stall, best = safe[0]
        text = (f"Lowest safe stall: {naming.display_name(best)} at {fmt(best_stall)} ms/action")
        if len(safe) > 1:
            second_stall, second = safe[1]
            ratio = second_stall / best_stall if best_stall else float("nan")
            tie = practical_tie(best_stall, second_stall)
            text += (f"; runner-up {naming.display_name(second)} is {fmt(ratio, 2)}x"
                     + (" (a tie under the 10% rule)" if tie else ""))
        findings.append(text + ".")
        cheap = sorted((summaries[p].kib, p) for p in eligible if pd.notna(summaries[p].kib))
        if cheap:
            findings.append(f"Lowest safe traffic: {naming.display_name(cheap[0][1])} at "
                            f"{fmt(cheap[0][0])} KiB/action.")
    short = [p for p, s in summaries.items() if s.available < s.scheduled]
    if short:
        findings.append("Not fully available (left out of the marks): " + ", ".join(
            f"{naming.display_name(p)} {summaries[p].available}/{summaries[p].scheduled}"
            + (f" ({summaries[p].aborted} aborted episode(s))" if summaries[p].aborted else "")
            for p in short) + ".")
    unsafe = [p for p, s in summaries.items() if s.invalid > 0]
    if unsafe:
        findings.append("Invalid actions issued by: " + ", ".join(
            f"{naming.display_name(p)} {summaries[p].invalid}/{summaries[p].issued}"
            for p in unsafe) + ".")
    never = [p for p, s in summaries.items() if naming.category(p) == naming.CURRENT
             and s.invalid == 0]
    if never:
        findings.append(f"{len(never)} derivation-current policies issued no invalid action.")
    if "planfence" in summaries and "batched_all_key" in summaries:
        result = _compare(frame, "policy", "planfence", "batched_all_key", STALL, options)
        if result is not None:
            findings.append(
                "PlanFence vs batched all-key, paired stall change (two-stage bootstrap 95% "
                f"interval): {_comparison_text(result)}.")
    return findings


# --- D.2 / D.3 / D.4: one setting column, several policies per setting ----------------------


def _setting_table(
    run: Run,
    frame: pd.DataFrame,
    *,
    dimension: str,
    label: Callable[[object], str],
    policies: Callable[[pd.DataFrame], list[str]],
    name: str,
    title: str,
    findings: Callable[[dict[str, dict[str, RowSummary]]], list[str]],
) -> Table:
    rows: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    per_setting: dict[str, dict[str, RowSummary]] = {}
    for value in slicing.sorted_values(frame, dimension):
        part = frame[frame[dimension] == value]
        summaries = {p: summarise(_policy(part, p), _strata()) for p in policies(part)}
        per_setting[label(value)] = summaries
        for policy, s in summaries.items():
            rows.append([Cell(label(value)), Cell(naming.display_name(policy)),
                         Cell(f"{s.valid}/{s.scheduled}"), Cell(fmt(s.stall_ms)),
                         Cell(fmt(s.kib))])
            records.append({dimension: value, "policy": policy, **_summary_row(s)})
    return _layout(run, frame, records,
        name=name,
        title=title,
        header=["Setting", "Method", "Valid / scheduled", "Stall (ms/action)",
                "Traffic (KiB/action)"],
        rows=rows,
        legend="Valid = issued with current recorded inputs; costs are medians over templates.",
        findings=findings(per_setting),
    )


def sync_tables(run: Run, options: Options) -> list[Table]:
    """D.2: metadata sync at each barrier interval K, with PlanFence, per rho."""
    tables = []
    for network in slicing.networks(run.episodes):
        chosen = slicing.slice_for(run.episodes, free=("rho",), where={"network": network})
        frame = chosen.episodes
        ks = {naming.sync_interval(p) for p in frame["policy"].unique()} - {None}
        if len(ks) < 2:
            continue

        def pick(part: pd.DataFrame) -> list[str]:
            chosen = [p for p in part["policy"].unique()
                      if naming.sync_interval(p) is not None or p == "planfence"]
            return sorted(chosen, key=lambda p: naming.sync_interval(p) or 10**9)

        tables.append(_setting_table(
            run, frame, dimension="rho", label=lambda v: f"rho={slicing.number(v)}",
            policies=pick, name=f"table_d2_{network}",
            title=f"Table D.2 layout: synchronization cadence K across rho on {network}",
            findings=_sync_findings))
    return tables


def _sync_findings(per_setting: dict[str, dict[str, RowSummary]]) -> list[str]:
    findings = []
    unsafe = sum(s.invalid for summaries in per_setting.values()
                 for p, s in summaries.items() if (naming.sync_interval(p) or 1) > 1)
    findings.append(f"Metadata sync with K > 1 issued {unsafe} invalid action(s) in total.")
    for policy in ("metadata_sync", "planfence"):
        series = [(r, s[policy].stall_ms) for r, s in per_setting.items() if policy in s]
        if len(series) >= 2 and series[0][1] > 0:
            findings.append(
                f"{naming.display_name(policy)} stall goes from {fmt(series[0][1])} to "
                f"{fmt(series[-1][1])} ms/action from {series[0][0]} to "
                f"{series[-1][0]} ({fmt(series[-1][1] / series[0][1], 2)}x).")
    return findings


def _ordering_findings(per_setting: dict[str, dict[str, RowSummary]]) -> list[str]:
    findings = []
    holds = []
    for value, summaries in per_setting.items():
        order = sorted((s.stall_ms, p) for p, s in summaries.items() if pd.notna(s.stall_ms))
        if order:
            findings.append(f"{value}: lowest stall "
                            f"{naming.display_name(order[0][1])} ({fmt(order[0][0])} ms/action).")
        three = [summaries[p].stall_ms for p in naming.PRIMARY_THREE[::-1] if p in summaries]
        if len(three) == 3:
            holds.append(three[0] < three[1] < three[2])
    if holds:
        findings.append("PlanFence < metadata sync < centralized lineage holds in "
                        f"{sum(holds)} of {len(holds)} settings.")
    return findings


def sensitivity_tables(run: Run, options: Options) -> list[Table]:
    """D.3 (team size N) and D.4 (horizon T) at rho = 4."""
    tables = []
    for dimension, code, what, prefix in (("agents", "d3", "team size", "N"),
                                          ("units", "d4", "horizon", "T")):
        if dimension not in run.episodes:
            continue
        for network in slicing.networks(run.episodes):
            chosen = slicing.slice_for(run.episodes, free=(dimension,),
                                      where={"network": network, "rho": 4.0})
            frame = chosen.episodes
            if frame.empty or frame[dimension].nunique() < 2:
                continue

            settings = frame.groupby("policy")[dimension].nunique()
            kept = [p for p in naming.ordered(settings.index)
                    if settings[p] >= 2 and naming.category(p) == naming.CURRENT]
            if not kept:
                continue
            frame = frame[frame["policy"].isin(kept)]

            def pick(part: pd.DataFrame, kept: list[str] = kept) -> list[str]:
                return [p for p in kept if p in set(part["policy"])]

            def label(value: object, prefix: str = prefix) -> str:
                return f"{prefix}={slicing.number(value)}"

            tables.append(_setting_table(
                run, frame, dimension=dimension, label=label, policies=pick,
                name=f"table_{code}_{network}",
                title=f"Table {code.upper().replace('D', 'D.')} layout: {what} "
                      f"sensitivity on {network}",
                findings=_ordering_findings))
    return tables


# --- D.5 and D.9: keyspace (and offsets), PlanFence against batched all-key -----------------

PAIR = ("batched_all_key", "planfence")


def _pair_marks(a: float, b: float) -> tuple[str, str]:
    """LOWER on the side at least 10% lower than the other, nothing for a tie."""
    if pd.isna(a) or pd.isna(b) or practical_tie(a, b):
        return "", ""
    return (LOWER, "") if a < b else ("", LOWER)


def keyspace_tables(run: Run, options: Options) -> list[Table]:
    frame = run.episodes[run.episodes["policy"].isin(PAIR)]
    if frame.empty or frame["keys"].nunique() < 2:
        return []
    chosen = slicing.slice_for(frame, free=("keys", "trace_offset_s", "network"))
    frame = chosen.episodes
    rows: list[list[Cell]] = []
    records: list[dict[str, object]] = []
    growth: list[str] = []
    for network in slicing.networks(frame):
        net = frame[frame["network"] == network]
        if set(net["policy"]) != set(PAIR) or net["keys"].nunique() < 2:
            continue
        kib_by_policy: dict[str, list[tuple[float, float]]] = {p: [] for p in PAIR}
        for keys in slicing.sorted_values(net, "keys"):
            part = net[net["keys"] == keys]
            s = {p: summarise(_policy(part, p), _strata()) for p in PAIR}
            stall_marks = _pair_marks(s[PAIR[0]].stall_ms, s[PAIR[1]].stall_ms)
            kib_marks = _pair_marks(s[PAIR[0]].kib, s[PAIR[1]].kib)
            result = _compare(part, "policy", "planfence", "batched_all_key", STALL, options)
            for i, policy in enumerate(PAIR):
                kib_by_policy[policy].append((float(str(keys)), s[policy].kib))
                rows.append([Cell(network), Cell(naming.display_name(policy)),
                             Cell(slicing.number(keys)),
                             Cell(f"{s[policy].valid}/{s[policy].scheduled}"),
                             Cell(fmt(s[policy].stall_ms), stall_marks[i]),
                             Cell(fmt(s[policy].kib), kib_marks[i]),
                             Cell(_comparison_text(result) if policy == "planfence" else "")])
                records.append({"network": network, "policy": policy, "keys": keys,
                                "offsets": part["trace_offset_s"].nunique(),
                                **_summary_row(s[policy]),
                                **(_comparison_columns("stall_vs_batched", result)
                                   if policy == "planfence" else {})})
        for policy, points in kib_by_policy.items():
            (k0, v0), (k1, v1) = points[0], points[-1]
            growth.append(f"{network}: {naming.display_name(policy)} traffic {fmt(v0)} -> "
                          f"{fmt(v1)} KiB/action from {slicing.number(k0)} to "
                          f"{slicing.number(k1)} keys ({fmt((v1 - v0) / (k1 - k0), 3)} "
                          "KiB/action per key).")
    if not rows:
        return []
    return [_layout(run, frame, records,
        name="table_d5",
        title="Table D.5 layout: keyspace, PlanFence against batched all-key validation",
        header=["Network", "Method", "Keys", "Valid / scheduled", "Stall (ms/action)",
                "Traffic (KiB/action)", "PlanFence stall change [95% CI]"],
        rows=rows,
        legend="Rows spanning several trace offsets give the median of per-offset medians. "
        "Bold: at least 10% lower than the other method (unmarked pairs are ties). The change "
        "column is PlanFence relative to batched all-key on paired templates.",
        findings=growth,
    )]


def offset_tables(run: Run, options: Options) -> list[Table]:
    """D.9: keys x trace offsets, one PlanFence/batched pair per stratum."""
    tables = []
    base = run.episodes[run.episodes["policy"].isin(PAIR)]
    for network in slicing.networks(base):
        chosen = slicing.slice_for(base, free=("keys", "trace_offset_s"),
                                  where={"network": network})
        frame = chosen.episodes
        if frame.empty or frame["trace_offset_s"].nunique() < 2 or set(frame["policy"]) != set(PAIR):
            continue
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        lower = ties = excl = total = 0
        for keys in slicing.sorted_values(frame, "keys"):
            for offset in slicing.sorted_values(frame, "trace_offset_s"):
                part = frame[(frame["keys"] == keys) & (frame["trace_offset_s"] == offset)]
                if set(part["policy"]) != set(PAIR):
                    continue
                s = {p: summarise(_policy(part, p), _strata()) for p in PAIR}
                result = _compare(part, "policy", "planfence", "batched_all_key", STALL, options)
                stall_marks = _pair_marks(s[PAIR[0]].stall_ms, s[PAIR[1]].stall_ms)
                kib_marks = _pair_marks(s[PAIR[0]].kib, s[PAIR[1]].kib)
                total += 1
                lower += int(s["planfence"].stall_ms < s["batched_all_key"].stall_ms)
                ties += int(practical_tie(s["planfence"].stall_ms, s["batched_all_key"].stall_ms))
                excl += int(result is not None and result.excludes_zero)
                for i, policy in enumerate(PAIR):
                    rows.append([Cell(slicing.number(keys)), Cell(f"{slicing.number(offset)} s"),
                                 Cell(naming.display_name(policy)),
                                 Cell(f"{s[policy].valid}/{s[policy].scheduled}"),
                                 Cell(fmt(s[policy].stall_ms), stall_marks[i]),
                                 Cell(fmt(s[policy].kib), kib_marks[i]),
                                 Cell(_comparison_text(result) if policy == "planfence" else "")])
                    records.append({"keys": keys, "trace_offset_s": offset, "policy": policy,
                                    **_summary_row(s[policy]),
                                    **(_comparison_columns("stall_vs_batched", result)
                                       if policy == "planfence" else {})})
        if total == 0:
            continue
        tables.append(_layout(run, frame, records,
            name=f"table_d9_{network}",
            title=f"Table D.9 layout: keys and trace offsets on {network}",
            header=["Keys", "Trace offset", "Method", "Valid / scheduled", "Stall (ms/action)",
                    "Traffic (KiB/action)", "PlanFence stall change [95% CI]"],
            rows=rows,
            legend="Bold: at least 10% lower within the keys/offset pair; unmarked pairs tie.",
            findings=[f"PlanFence has the lower median stall in {lower} of {total} keys/offset "
                      f"pairs ({ties} within the 10% tie band); the paired interval excludes "
                      f"zero in {excl} of {total}."],
        ))
    return tables


# --- D.6: declared dependencies ---------------------------------------------------------------


DENSITY = ("batched_all_key", "planfence", "planfence_grouped")
_SHORT = {"batched_all_key": "batched", "planfence": "PlanFence",
          "planfence_grouped": "PlanFence grouped"}


def _lowest_marks(values: dict[str, float]) -> dict[str, str]:
    """LOWER on the method at least 10% below every other one; nothing otherwise."""
    finite = sorted((v, k) for k, v in values.items() if pd.notna(v))
    if len(finite) < 2 or practical_tie(finite[0][0], finite[1][0]):
        return {}
    return {finite[0][1]: LOWER}


def density_tables(run: Run, options: Options) -> list[Table]:
    """D.6: widening the declared dependency set, PlanFence (and grouped) against batched."""
    tables = []
    base = run.episodes[run.episodes["policy"].isin(DENSITY)]
    for network in slicing.networks(base):
        frame = slicing.slice_for(base, free=("deps",), where={"network": network}).episodes
        if frame.empty or frame["deps"].nunique() < 2 or not set(PAIR) <= set(frame["policy"]):
            continue
        methods = [p for p in DENSITY if p in set(frame["policy"])]
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        findings: list[str] = []
        for deps in slicing.sorted_values(frame, "deps"):
            part = frame[frame["deps"] == deps]
            s = {p: summarise(_policy(part, p), _strata()) for p in methods}
            sm = _lowest_marks({p: v.stall_ms for p, v in s.items()})
            km = _lowest_marks({p: v.kib for p, v in s.items()})
            result = _compare(part, "policy", "planfence", "batched_all_key", STALL, options)
            rows.append([Cell(f"d={slicing.number(deps)}"),
                         *[Cell(f"{s[p].valid}/{s[p].scheduled}") for p in methods],
                         *[Cell(fmt(s[p].stall_ms), sm.get(p, "")) for p in methods],
                         *[Cell(fmt(s[p].kib), km.get(p, "")) for p in methods],
                         Cell(_comparison_text(result))])
            record: dict[str, object] = {"deps": deps}
            for p in methods:
                record.update({f"{p}_{k}": v for k, v in _summary_row(s[p]).items()})
            records.append({**record, **_comparison_columns("stall_vs_batched", result)})
            findings.append(f"d={slicing.number(deps)}: stall "
                            f"{_verdict(s['planfence'].stall_ms, s['batched_all_key'].stall_ms)}, "
                            f"traffic {_verdict(s['planfence'].kib, s['batched_all_key'].kib)}.")
        tables.append(_layout(run, frame, records,
            name=f"table_d6_{network}",
            title=f"Table D.6 layout: declared dependencies on {network}",
            header=["Dependencies",
                    *[f"Valid / scheduled ({_SHORT[p]})" for p in methods],
                    *[f"Stall {_SHORT[p]}" for p in methods],
                    *[f"KiB {_SHORT[p]}" for p in methods],
                    "PlanFence vs batched stall change [95% CI]"],
            rows=rows,
            legend="Stall in ms/action, traffic in KiB/action (medians over templates). Bold: at "
            "least 10% lower than every other method in the row; unmarked rows are ties.",
            findings=findings,
        ))
    return tables


def _verdict(planfence: float, other: float) -> str:
    if pd.isna(planfence) or pd.isna(other):
        return "not comparable"
    if practical_tie(planfence, other):
        return "tie"
    return "PlanFence lower" if planfence < other else "batched all-key lower"


# --- D.7: four-policy rate sweep --------------------------------------------------------------


def rate_tables(run: Run, options: Options) -> list[Table]:
    tables = []
    for network in slicing.networks(run.episodes):
        frame = slicing.slice_for(run.episodes, free=("rho",), where={"network": network}).episodes
        frame = frame[frame["policy"].isin(naming.RATE_FOUR)]
        present = set(frame["policy"])
        if frame.empty or frame["rho"].nunique() < 2 or "planfence" not in present \
                or len(present) < 2:
            continue
        policies = [p for p in naming.RATE_FOUR if p in set(frame["policy"])]
        with_pair = set(PAIR) <= set(policies)
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        changes: list[float] = []
        winners: list[str] = []
        for rho in slicing.sorted_values(frame, "rho"):
            part = frame[frame["rho"] == rho]
            s = {p: summarise(_policy(part, p), _strata()) for p in policies}
            best = rank_marks({p: v.stall_ms for p, v in s.items()}, set(s))
            result = (_compare(part, "policy", "planfence", "batched_all_key", STALL, options)
                      if "batched_all_key" in s else None)
            rows.append([Cell(slicing.number(rho)),
                         *[Cell(fmt(s[p].stall_ms), BEST if best.get(p) == BEST else "")
                           for p in policies],
                         *([Cell(_comparison_text(result))] if with_pair else [])])
            record: dict[str, object] = {"rho": rho}
            for p in policies:
                record.update({f"{p}_stall_ms_median": s[p].stall_ms,
                               f"{p}_valid": s[p].valid, f"{p}_scheduled": s[p].scheduled})
            records.append({**record, **_comparison_columns("planfence_vs_batched", result)})
            if result is not None:
                changes.append(result.change)
            winner = next((p for p, m in best.items() if m == BEST), None)
            if winner:
                winners.append(f"rho={slicing.number(rho)}: {naming.display_name(winner)}")
        findings = ["Lowest median stall per rate: " + "; ".join(winners) + "."]
        spreads = []
        for p in policies:
            column = pd.Series([r[f"{p}_stall_ms_median"] for r in records], dtype=float)
            if column.notna().sum() >= 2 and column.min() > 0:
                spreads.append(f"{naming.display_name(p)} {fmt(column.max() / column.min(), 2)}x")
        if spreads:
            findings.append("Spread of median stall across rho (max/min): "
                            + ", ".join(spreads) + ".")
        if changes:
            findings.append(f"PlanFence vs batched all-key stall change ranges from "
                            f"{pct(min(changes))} to {pct(max(changes))}.")
        tables.append(_layout(run, frame, records,
            name=f"table_d7_{network}",
            title=f"Table D.7 layout: median stall (ms/action) across rho on {network}",
            header=["rho", *[naming.display_name(p) for p in policies],
                    *(["PlanFence vs batched [95% CI]"] if with_pair else [])],
            rows=rows,
            legend="Bold: lowest median stall in the row. The last column is PlanFence's paired "
            "change relative to batched all-key with its two-stage bootstrap interval; 'tie' "
            "marks a difference under 10% of the larger median.",
            findings=findings,
        ))
    return tables


# --- H.1: fresh against reused connections ----------------------------------------------------


def reuse_tables(run: Run, options: Options) -> list[Table]:
    tables = []
    for network in slicing.networks(run.episodes):
        frame = slicing.slice_for(run.episodes, free=("connection", "keys", "rho"),
                                 where={"network": network}).episodes
        both = frame.groupby(["policy", "keys", "rho"])["connection"].transform("nunique")
        frame = frame[both >= 2]
        if not {"fresh", "reuse"} <= set(frame["connection"].astype(str)):
            continue
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        lower = total = 0
        byte_changes: list[float] = []
        configs = sorted(
            frame[["policy", "keys", "rho"]].drop_duplicates().itertuples(index=False),
            key=lambda c: (float(c[1]), float(c[2]), naming.sort_key(str(c[0]))),
        )
        for policy, keys, rho in configs:
            part = frame[(frame["policy"] == policy) & (frame["keys"] == keys)
                         & (frame["rho"] == rho)]
            arms = {c: summarise(part[part["connection"] == c], _strata())
                    for c in ("fresh", "reuse")}
            if arms["fresh"].episodes == 0 or arms["reuse"].episodes == 0:
                continue
            result = _compare(part, "connection", "reuse", "fresh", STALL, options)

            def stall(s: RowSummary) -> str:
                text = f"{fmt(s.stall_ms, 0)} [{fmt(s.stall_q1_ms, 0)}, {fmt(s.stall_q3_ms, 0)}]"
                return text + (" ‡" if s.aborted else "")

            total += 1
            lower += int(arms["reuse"].stall_ms < arms["fresh"].stall_ms)
            if arms["fresh"].kib:
                byte_changes.append(arms["reuse"].kib / arms["fresh"].kib - 1)
            rows.append([Cell(naming.display_name(str(policy))), Cell(slicing.number(keys)),
                         Cell(slicing.number(rho)), Cell(stall(arms["fresh"])),
                         Cell(stall(arms["reuse"])), Cell(fmt(arms["fresh"].kib)),
                         Cell(fmt(arms["reuse"].kib)),
                         Cell(f"{fmt(arms['fresh'].connections, 0)} / "
                              f"{fmt(arms['reuse'].connections, 0)}"),
                         Cell(_comparison_text(result))])
            record: dict[str, object] = {"policy": policy, "keys": keys, "rho": rho}
            for c, s in arms.items():
                record.update({f"{c}_{k}": v for k, v in _summary_row(s).items()})
            records.append({**record, **_comparison_columns("reuse_vs_fresh", result)})
        if total == 0:
            continue
        findings = [f"Reuse lowers median stall in {lower} of {total} configurations."]
        if byte_changes:
            findings.append("Traffic changes with reuse by "
                            f"{pct(min(byte_changes))} to {pct(max(byte_changes))}.")
        tables.append(_layout(run, frame, records,
            name=f"table_h1_{network}",
            title=f"Table H.1 layout: new connection per RPC against reused connections "
                  f"on {network}",
            header=["Method", "Keys", "rho", "Stall fresh", "Stall reused", "KiB fresh",
                    "KiB reused", "Connections fresh / reused", "Reuse stall change [95% CI]"],
            rows=rows,
            legend="Stall: episode median [interquartile range] in ms/action; traffic and "
            "connections are episode medians. ‡: an aborted episode, whose costs are left out.",
            findings=findings,
        ))
    return tables


BUILDERS: Sequence[Callable[[Run, Options], list[Table]]] = (
    policy_tables,
    sync_tables,
    sensitivity_tables,
    keyspace_tables,
    density_tables,
    rate_tables,
    offset_tables,
    reuse_tables,
)


def build_tables(run: Run, *, draws: int, seed: int) -> list[Table]:
    options = Options(draws=draws, seed=seed)
    return [table for builder in BUILDERS for table in builder(run, options)]
