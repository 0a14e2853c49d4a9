"""Policy comparisons: Table 2, D.1-D.2 (every policy at one setting) and the K sweep.

See docs/reports.md for how to read each one.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.stats import RowSummary, practical_tie, summarise
from testbed.report.table_common import (
    KIB,
    STALL,
    Options,
    compare_pair,
    comparison_columns,
    comparison_text,
    layout,
    policy_rows,
    rank_marks,
    strata,
    summary_row,
    with_provenance,
)
from testbed.report.tabular import Cell, Table, fmt


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
    unresolved: list[str] = []
    for policy in policies:
        if policy == "planfence":
            continue
        stall = compare_pair(frame, "policy", "planfence", policy, STALL, options)
        if stall is not None and stall.verdict == "lower":
            lower.append(policy)
        elif stall is not None and stall.verdict == "unresolved":
            unresolved.append(policy)
        kib = compare_pair(frame, "policy", "planfence", policy, KIB, options)
        rows.append([Cell(naming.display_name(policy)), Cell(naming.category(policy)),
                     Cell(str(stall.pairs if stall else 0)), Cell(comparison_text(stall)),
                     Cell(comparison_text(kib))])
        records.append({"policy": policy, "category": naming.category(policy),
                        **comparison_columns("stall", stall), **comparison_columns("kib", kib)})
    findings = []
    if lower:
        findings.append("PlanFence's paired median stall is more than 10% below, with the "
                        "whole 95% interval below the tie band: "
                        + ", ".join(naming.display_name(str(p)) for p in lower) + ".")
    if unresolved:
        findings.append("Unresolved at this size (the interval straddles the tie band; more "
                        "templates or --repeats narrow it): "
                        + ", ".join(naming.display_name(str(p)) for p in unresolved) + ".")
    return layout(run, frame, records,
        name=f"paired_d1_{network}",
        title=f"Paired comparisons at rho = 4 on {network}: PlanFence against each policy",
        header=["Against", "Category", "Paired templates", "Stall change [95% CI]",
                "Traffic change [95% CI]"],
        rows=rows,
        legend="Change = PlanFence median / other median - 1 over templates with identical "
        "schedules (aborted episodes dropped with their pair); 95% two-stage bootstrap "
        "interval, its resolution (half-width) and the verdict against the 10% tie band: "
        "lower, higher, tie, or unresolved at this size when the interval straddles the band.",
        findings=findings,
    )


def _policy_table(
    run: Run, frame: pd.DataFrame, policies: list[str], name: str, title: str, options: Options
) -> Table:
    summaries = {p: summarise(policy_rows(frame, p), strata()) for p in policies}
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
        records.append({"category": cat, "policy": policy, **summary_row(s),
                        "stall_mark": stall_marks.get(policy, ""),
                        "kib_mark": kib_marks.get(policy, "")})
    data = with_provenance(run, pd.DataFrame(records), frame)
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
        result = compare_pair(frame, "policy", "planfence", "batched_all_key", STALL, options)
        if result is not None:
            findings.append(
                "PlanFence vs batched all-key, paired stall change (two-stage bootstrap 95% "
                f"interval): {comparison_text(result)}.")
    return findings


# --- D.2 / D.3 / D.4: one setting column, several policies per setting ----------------------


def setting_table(
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
        summaries = {p: summarise(policy_rows(part, p), strata()) for p in policies(part)}
        per_setting[label(value)] = summaries
        for policy, s in summaries.items():
            rows.append([Cell(label(value)), Cell(naming.display_name(policy)),
                         Cell(f"{s.valid}/{s.scheduled}"), Cell(fmt(s.stall_ms)),
                         Cell(fmt(s.kib))])
            records.append({dimension: value, "policy": policy, **summary_row(s)})
    return layout(run, frame, records,
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

        tables.append(setting_table(
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


def ordering_findings(per_setting: dict[str, dict[str, RowSummary]]) -> list[str]:
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
