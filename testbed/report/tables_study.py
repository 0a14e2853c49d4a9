"""Studies across a dimension: sensitivity (D.5/D.9), keyspace (D.5), trace offset,
density (D.6), update rate (D.7) and connection reuse (H.1).

See docs/reports.md for how to read each one.
"""

from __future__ import annotations

import pandas as pd

from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.stats import (
    RatioSummary,
    RowSummary,
    paired,
    practical_tie,
    ratio_median,
    summarise,
)
from testbed.report.table_common import (
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
)
from testbed.report.tables_policy import ordering_findings, setting_table
from testbed.report.tabular import BEST, LOWER, Cell, Table, fmt, pct


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

            tables.append(setting_table(
                run, frame, dimension=dimension, label=label, policies=pick,
                name=f"table_{code}_{network}",
                title=f"Table {code.upper().replace('D', 'D.')} layout: {what} "
                      f"sensitivity on {network}",
                findings=ordering_findings))
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
            s = {p: summarise(policy_rows(part, p), strata()) for p in PAIR}
            stall_marks = _pair_marks(s[PAIR[0]].stall_ms, s[PAIR[1]].stall_ms)
            kib_marks = _pair_marks(s[PAIR[0]].kib, s[PAIR[1]].kib)
            result = compare_pair(part, "policy", "planfence", "batched_all_key", STALL, options)
            for i, policy in enumerate(PAIR):
                kib_by_policy[policy].append((float(str(keys)), s[policy].kib))
                rows.append([Cell(network), Cell(naming.display_name(policy)),
                             Cell(slicing.number(keys)),
                             Cell(f"{s[policy].valid}/{s[policy].scheduled}"),
                             Cell(fmt(s[policy].stall_ms), stall_marks[i]),
                             Cell(fmt(s[policy].kib), kib_marks[i]),
                             Cell(comparison_text(result) if policy == "planfence" else "")])
                records.append({"network": network, "policy": policy, "keys": keys,
                                "offsets": part["trace_offset_s"].nunique(),
                                **summary_row(s[policy]),
                                **(comparison_columns("stall_vs_batched", result)
                                   if policy == "planfence" else {})})
        for policy, points in kib_by_policy.items():
            (k0, v0), (k1, v1) = points[0], points[-1]
            growth.append(f"{network}: {naming.display_name(policy)} traffic {fmt(v0)} -> "
                          f"{fmt(v1)} KiB/action from {slicing.number(k0)} to "
                          f"{slicing.number(k1)} keys ({fmt((v1 - v0) / (k1 - k0), 3)} "
                          "KiB/action per key).")
    if not rows:
        return []
    return [layout(run, frame, records,
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
        lower = ties = excl = total = unresolved = 0
        for keys in slicing.sorted_values(frame, "keys"):
            for offset in slicing.sorted_values(frame, "trace_offset_s"):
                part = frame[(frame["keys"] == keys) & (frame["trace_offset_s"] == offset)]
                if set(part["policy"]) != set(PAIR):
                    continue
                s = {p: summarise(policy_rows(part, p), strata()) for p in PAIR}
                result = compare_pair(part, "policy", "planfence", "batched_all_key", STALL, options)
                stall_marks = _pair_marks(s[PAIR[0]].stall_ms, s[PAIR[1]].stall_ms)
                kib_marks = _pair_marks(s[PAIR[0]].kib, s[PAIR[1]].kib)
                total += 1
                lower += int(s["planfence"].stall_ms < s["batched_all_key"].stall_ms)
                ties += int(practical_tie(s["planfence"].stall_ms, s["batched_all_key"].stall_ms))
                excl += int(result is not None and result.excludes_zero)
                unresolved += int(result is None or result.verdict == "unresolved")
                for i, policy in enumerate(PAIR):
                    rows.append([Cell(slicing.number(keys)), Cell(f"{slicing.number(offset)} s"),
                                 Cell(naming.display_name(policy)),
                                 Cell(f"{s[policy].valid}/{s[policy].scheduled}"),
                                 Cell(fmt(s[policy].stall_ms), stall_marks[i]),
                                 Cell(fmt(s[policy].kib), kib_marks[i]),
                                 Cell(comparison_text(result) if policy == "planfence" else "")])
                    records.append({"keys": keys, "trace_offset_s": offset, "policy": policy,
                                    **summary_row(s[policy]),
                                    **(comparison_columns("stall_vs_batched", result)
                                       if policy == "planfence" else {})})
        if total == 0:
            continue
        tables.append(layout(run, frame, records,
            name=f"table_d9_{network}",
            title=f"Table D.9 layout: keys and trace offsets on {network}",
            header=["Keys", "Trace offset", "Method", "Valid / scheduled", "Stall (ms/action)",
                    "Traffic (KiB/action)", "PlanFence stall change [95% CI]"],
            rows=rows,
            legend="Bold: at least 10% lower within the keys/offset pair; unmarked pairs tie.",
            findings=[f"PlanFence has the lower median stall in {lower} of {total} keys/offset "
                      f"pairs ({ties} within the 10% tie band); the paired interval excludes "
                      f"zero in {excl} of {total}, and straddles the tie band (unresolved "
                      f"at this size) in {unresolved} of {total}."],
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
            s = {p: summarise(policy_rows(part, p), strata()) for p in methods}
            sm = _lowest_marks({p: v.stall_ms for p, v in s.items()})
            km = _lowest_marks({p: v.kib for p, v in s.items()})
            result = compare_pair(part, "policy", "planfence", "batched_all_key", STALL, options)
            rows.append([Cell(f"d={slicing.number(deps)}"),
                         *[Cell(f"{s[p].valid}/{s[p].scheduled}") for p in methods],
                         *[Cell(fmt(s[p].stall_ms), sm.get(p, "")) for p in methods],
                         *[Cell(fmt(s[p].kib), km.get(p, "")) for p in methods],
                         Cell(comparison_text(result))])
            record: dict[str, object] = {"deps": deps}
            for p in methods:
                record.update({f"{p}_{k}": v for k, v in summary_row(s[p]).items()})
            records.append({**record, **comparison_columns("stall_vs_batched", result)})
            findings.append(f"d={slicing.number(deps)}: stall "
                            f"{_verdict(s['planfence'].stall_ms, s['batched_all_key'].stall_ms)}, "
                            f"traffic {_verdict(s['planfence'].kib, s['batched_all_key'].kib)}.")
        tables.append(layout(run, frame, records,
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
            s = {p: summarise(policy_rows(part, p), strata()) for p in policies}
            best = rank_marks({p: v.stall_ms for p, v in s.items()}, set(s))
            result = (compare_pair(part, "policy", "planfence", "batched_all_key", STALL, options)
                      if "batched_all_key" in s else None)
            rows.append([Cell(slicing.number(rho)),
                         *[Cell(fmt(s[p].stall_ms), BEST if best.get(p) == BEST else "")
                           for p in policies],
                         *([Cell(comparison_text(result))] if with_pair else [])])
            record: dict[str, object] = {"rho": rho}
            for p in policies:
                record.update({f"{p}_stall_ms_median": s[p].stall_ms,
                               f"{p}_valid": s[p].valid, f"{p}_scheduled": s[p].scheduled})
            records.append({**record, **comparison_columns("planfence_vs_batched", result)})
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
        tables.append(layout(run, frame, records,
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


def _ratio(frame: pd.DataFrame, vary: str, a: object, b: object,
           options: Options) -> RatioSummary | None:
    """The paper's H.1 statistic: median of paired per-template ratios a / b."""
    pairs = paired(frame, vary=vary, a=a, b=b, metric=STALL, strata=strata())
    return ratio_median(pairs, seed=options.seed)


def _ratio_text(result: RatioSummary | None) -> str:
    if result is None:
        return "–"
    return f"{fmt(result.median, 2)} [{fmt(result.low, 2)}, {fmt(result.high, 2)}]"


def _reuse_ratio_findings(frame: pd.DataFrame, options: Options) -> list[str]:
    """Per-template ratios with reused connections, as the paper's appendix H gives them."""
    reused = frame[frame["connection"].astype(str) == "reuse"]
    findings = []
    for other in ("metadata_sync", "batched_all_key"):
        texts = []
        for keys in slicing.sorted_values(reused, "keys"):
            for rho in slicing.sorted_values(reused, "rho"):
                part = reused[(reused["keys"] == keys) & (reused["rho"] == rho)]
                result = _ratio(part, "policy", "planfence", other, options)
                if result is not None:
                    texts.append(f"{_ratio_text(result)} at rho={slicing.number(rho)}, "
                                 f"{slicing.number(keys)} keys")
        if texts:
            findings.append(f"Reused connections, median per-template PlanFence / "
                            f"{naming.display_name(other)} stall ratio: " + "; ".join(texts)
                            + ".")
    return findings


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
            arms = {c: summarise(part[part["connection"] == c], strata())
                    for c in ("fresh", "reuse")}
            if arms["fresh"].episodes == 0 or arms["reuse"].episodes == 0:
                continue
            result = compare_pair(part, "connection", "reuse", "fresh", STALL, options)
            ratio = _ratio(part, "connection", "reuse", "fresh", options)

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
                         Cell(comparison_text(result)), Cell(_ratio_text(ratio)),
                         Cell(f"{fmt(_payload(part, 'fresh'))} / "
                              f"{fmt(_payload(part, 'reuse'))}")])
            record: dict[str, object] = {
                "policy": policy, "keys": keys, "rho": rho,
                "ratio_pairs": ratio.pairs if ratio else 0,
                "ratio_median": ratio.median if ratio else float("nan"),
                "ratio_low": ratio.low if ratio else float("nan"),
                "ratio_high": ratio.high if ratio else float("nan"),
                "fresh_kib_payload_median": _payload(part, "fresh"),
                "reuse_kib_payload_median": _payload(part, "reuse")}
            for c, s in arms.items():
                record.update({f"{c}_{k}": v for k, v in summary_row(s).items()})
            records.append({**record, **comparison_columns("reuse_vs_fresh", result)})
        if total == 0:
            continue
        findings = [f"Reuse lowers median stall in {lower} of {total} configurations."]
        if byte_changes:
            findings.append("Traffic changes with reuse by "
                            f"{pct(min(byte_changes))} to {pct(max(byte_changes))}; without "
                            "channel handshakes it " + _payload_change(frame) + ".")
        findings += _reuse_ratio_findings(frame, options)
        tables.append(layout(run, frame, records,
            name=f"table_h1_{network}",
            title=f"Table H.1 layout: new connection per RPC against reused connections "
                  f"on {network}",
            header=["Method", "Keys", "rho", "Stall fresh", "Stall reused", "KiB fresh",
                    "KiB reused", "Connections fresh / reused", "Reuse stall change [95% CI]",
                    "Per-template ratio reused / fresh [95%]",
                    "KiB w/o handshakes fresh / reused"],
            rows=rows,
            legend="Stall: episode median [interquartile range] in ms/action; traffic and "
            "connections are episode medians. ‡: an aborted episode, whose costs are left out. "
            "The change column is the ratio of medians with the two-stage bootstrap; the "
            "ratio column is the paper's H.1 statistic, the median of paired per-template "
            "ratios with a 2,000-draw bootstrap over templates.",
            findings=findings,
        ))
    return tables


def _payload(frame: pd.DataFrame, connection: str) -> float:
    part = frame[frame["connection"].astype(str) == connection]
    if "kib_per_action_payload" not in part or part["kib_per_action_payload"].isna().all():
        return float("nan")
    return float(part["kib_per_action_payload"].median())


def _payload_change(frame: pd.DataFrame) -> str:
    """How traffic without channel handshakes changes with reuse, on paired schedules."""
    if "kib_per_action_payload" not in frame or frame["kib_per_action_payload"].isna().all():
        return "is not recorded in this run"
    pairs = paired(frame, vary="connection", a="reuse", b="fresh",
                   metric="kib_per_action_payload", strata=strata())
    if pairs.empty:
        return "has no paired episodes"
    same = int((pairs["a"] == pairs["b"]).sum())
    worst = float(((pairs["a"] - pairs["b"]) / pairs["b"]).abs().max())
    return f"is identical in {same} of {len(pairs)} paired episodes (largest difference {pct(worst)})"
