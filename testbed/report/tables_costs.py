"""Replicated batches (D.8), the artifact tier (C.6) and explainable costs (E.1).

See docs/reports.md for how to read each one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from testbed.campaign.workload import ARTIFACT_BYTES
from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.stats import cost_episodes, median_iqr, practical_tie
from testbed.report.table_common import STALL, Options, layout
from testbed.report.tabular import Cell, Table, fmt, pct

BATCH_POLICIES = ("metadata_sync", "centralized_lineage", "per_key_all_key",
                  "batched_all_key", "planfence")
ARTIFACT_MEAN_BYTES = sum(ARTIFACT_BYTES) / 2
CONNECTION_LABELS = {"fresh": "new per RPC", "reuse": "persistent",
                     "reuse_warm": "persistent, pre-warmed"}


def _median(frame: pd.DataFrame, column: str) -> float:
    costs = cost_episodes(frame)
    return median_iqr(costs[column])[0] if column in costs else float("nan")


# --- D.8: replicated batches --------------------------------------------------------------


def batch_tables(run: Run, options: Options) -> list[Table]:
    if "batch" not in run.episodes or run.episodes["batch"].nunique() < 2:
        return []
    tables = []
    for network in slicing.networks(run.episodes):
        frame = slicing.slice_for(run.episodes, free=("batch", "connection"),
                                  where={"network": network}).episodes
        policies = [p for p in BATCH_POLICIES if p in set(frame["policy"])]
        policies += [p for p in naming.ordered(frame["policy"].unique()) if p not in policies]
        if frame["batch"].nunique() < 2 or not policies:
            continue
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        arms = frame[["batch", "connection"]].drop_duplicates().sort_values(
            ["batch", "connection"]).itertuples(index=False)
        reductions: dict[str, list[float]] = {"fresh": [], "reuse": []}
        for batch, connection in arms:
            part = frame[(frame["batch"] == batch) & (frame["connection"] == connection)]
            medians = {p: _median(part[part["policy"] == p], STALL) for p in policies}
            pf, bk = medians.get("planfence"), medians.get("batched_all_key")
            reduction = (1 - pf / bk) if pf is not None and bk else float("nan")
            if pd.notna(reduction):
                reductions.setdefault(str(connection), []).append(reduction)
            available = int(part["available"].sum())
            scheduled = int(part["scheduled"].sum())
            rows.append([Cell(str(batch)), Cell(CONNECTION_LABELS.get(str(connection),
                                                                      str(connection))),
                         *[Cell(fmt(medians[p])) for p in policies], Cell(pct(reduction)),
                         Cell(f"{available}/{scheduled}")])
            records.append({"batch": batch, "connection": connection,
                            **{f"{p}_stall_ms_median": medians[p] for p in policies},
                            "planfence_reduction_vs_batched": reduction,
                            "available": available, "scheduled": scheduled})
        findings = []
        fresh = frame[frame["connection"] == "fresh"]
        for policy in policies:
            per_batch = [_median(fresh[(fresh["policy"] == policy) & (fresh["batch"] == b)],
                                 STALL) for b in slicing.sorted_values(fresh, "batch")]
            per_batch = [v for v in per_batch if pd.notna(v)]
            if len(per_batch) >= 2:
                spread = (max(per_batch) - min(per_batch)) / pd.Series(per_batch).median()
                findings.append(f"{naming.display_name(policy)}: fresh-batch medians "
                                f"{fmt(min(per_batch))}-{fmt(max(per_batch))} ms/action, "
                                f"spread {pct(spread).lstrip('+')} of their median.")
        for connection, values in reductions.items():
            if values:
                findings.append(f"PlanFence below batched all-key by {pct(min(values))} to "
                                f"{pct(max(values))} ({connection}).")
        findings.append(_accounting(frame))
        tables.append(layout(run, frame, records,
            name=f"table_d8_{network}",
            title=f"Table D.8 layout: the headline configuration in separate batches on "
                  f"{network}",
            header=["Batch", "Connections", *[naming.display_name(p) for p in policies],
                    "PlanFence vs batched", "Available / scheduled"],
            rows=rows,
            legend="Median stall (ms/action) over templates per batch. Each batch ran on "
            "topologies (processes, namespaces, emulator) of its own, after the previous one; "
            "schedules are identical across batches. Reduction = 1 - PlanFence / batched "
            "all-key (ratio of medians, as the paper's D.8).",
            findings=findings,
        ))
    return tables


def _accounting(frame: pd.DataFrame) -> str:
    """One finding: invalid actions, availability and aborted episodes of a table."""
    return (f"{int(frame['invalid_n'].sum())} invalid actions; availability "
            f"{int(frame['available'].sum())}/{int(frame['scheduled'].sum())}; "
            f"{int(frame['aborted'].sum())} aborted episode(s).")


# --- C.6: the artifact tier ----------------------------------------------------------------


def artifact_tables(run: Run, options: Options) -> list[Table]:
    episodes, actions = run.episodes, run.actions
    if "tier" not in episodes or "artifact" not in set(episodes["tier"]):
        return []
    tables = []
    for network in slicing.networks(episodes):
        frame = slicing.slice_for(episodes, free=("tier", "rho"),
                                  where={"network": network}).episodes
        policies = naming.ordered(frame["policy"].unique())
        rows: list[list[Cell]] = []
        records: list[dict[str, object]] = []
        crossings: list[int] = []
        for rho in slicing.sorted_values(frame, "rho"):
            for policy in policies:
                part = frame[(frame["rho"] == rho) & (frame["policy"] == policy)]
                tiers = {t: part[part["tier"] == t] for t in ("compact", "artifact")}
                art = actions[actions["episode"].isin(tiers["artifact"]["episode"])]
                fetched = (art["fetch_bytes"] / ARTIFACT_MEAN_BYTES).round() \
                    if "fetch_bytes" in art else pd.Series(dtype=float)
                on_path = fetched[art["replans"] > 0] if len(fetched) else fetched
                crossings += [round(float(x)) for x in on_path.dropna()]
                plan_cross = (tiers["artifact"]["planning_bytes"]
                              / ARTIFACT_MEAN_BYTES / tiers["artifact"]["attempted_actions"]
                              ) if "planning_bytes" in tiers["artifact"] else pd.Series()
                cells = [Cell(slicing.number(rho)), Cell(naming.display_name(policy))]
                record: dict[str, object] = {"rho": rho, "policy": policy}
                for tier, rows_t in tiers.items():
                    cells.append(Cell(f"{int(rows_t['valid'].sum())}/"
                                      f"{int(rows_t['scheduled'].sum())}"))
                    record[f"{tier}_valid"] = int(rows_t["valid"].sum())
                    record[f"{tier}_scheduled"] = int(rows_t["scheduled"].sum())
                for metric in (STALL, "kib_per_action"):
                    for tier, rows_t in tiers.items():
                        value = _median(rows_t, metric)
                        cells.append(Cell(fmt(value)))
                        record[f"{tier}_{metric}_median"] = value
                mean_path = float(on_path.mean()) if len(on_path) else float("nan")
                mean_plan = float(plan_cross.median()) if len(plan_cross) else float("nan")
                cells += [Cell(fmt(mean_path, 2)), Cell(fmt(mean_plan, 2))]
                record.update(artifact_fetches_per_changed_action=mean_path,
                              artifact_planning_crossings_per_action=mean_plan)
                rows.append(cells)
                records.append(record)
        findings = []
        if crossings:
            counts = Counter(crossings)
            findings.append("Artifact fetches on the action path of artifact-tier actions that "
                            "saw a change: " + ", ".join(f"{k}x in {counts[k]}"
                                                         for k in sorted(counts))
                            + " actions (each fetched artifact is verified against its ID and "
                            "its owner's signature before it is installed).")
        findings.append(_accounting(frame))
        tables.append(layout(run, frame, records,
            name=f"table_c6_{network}",
            title=f"Artifact tier (appendix C.6) against compact records on {network}",
            header=["rho", "Method", "Valid compact", "Valid artifact", "Stall compact",
                    "Stall artifact", "KiB compact", "KiB artifact",
                    "Artifact fetches per changed action", "Artifact planning crossings"],
            rows=rows,
            legend="Stall in ms/action and traffic in KiB/action, medians over templates. "
            "Artifact fetches: changed artifacts the executor fetched and verified on the "
            "action path, per action that replanned (fetch bytes over the mean artifact size, "
            "rounded). Planning crossings: artifacts moved by planning and handoff per "
            "action (planner fetches and installs at the executor).",
            findings=findings,
        ))
    return tables


# --- E.1: explainable costs -------------------------------------------------------------------

PHASES = ("query", "fetch", "revalidation")
EPISODE_PHASES = ("planning", *PHASES, "commit", "barrier")


@dataclass(frozen=True)
class CostRow:
    """Explainable costs of one policy and connection setting (means per action)."""

    policy: str
    connection: str
    rounds: float
    connections: float
    share_opening: float
    stall_opening_ms: float
    stall_not_opening_ms: float
    phase_ms: dict[str, float]
    phase_kib: dict[str, float]
    kib_payload: float

    def record(self) -> dict[str, object]:
        return {"policy": self.policy, "connection": self.connection,
                "rounds_per_action": self.rounds, "connections_per_action": self.connections,
                "share_opening": self.share_opening,
                "stall_ms_opening": self.stall_opening_ms,
                "stall_ms_not_opening": self.stall_not_opening_ms,
                **{f"{p}_ms_per_action": v for p, v in self.phase_ms.items()},
                **{f"{p}_kib_per_action": v for p, v in self.phase_kib.items()},
                "kib_per_action_payload": self.kib_payload}

    def cells(self) -> list[Cell]:
        return [Cell(naming.display_name(self.policy)), Cell(self.connection),
                Cell(fmt(self.rounds, 2)), Cell(fmt(self.connections, 2)),
                Cell(pct(self.share_opening).lstrip("+")),
                Cell(f"{fmt(self.stall_opening_ms, 0)} / {fmt(self.stall_not_opening_ms, 0)}"),
                Cell(" / ".join(fmt(self.phase_ms[p], 0) for p in PHASES)),
                Cell(" / ".join(fmt(self.phase_kib[p], 2) for p in PHASES)),
                Cell(fmt(self.phase_kib["planning"], 2)),
                Cell(f"{fmt(self.phase_kib['commit'], 2)} / "
                     f"{fmt(self.phase_kib['barrier'], 2)}"),
                Cell(fmt(self.kib_payload))]


def _cost_row(policy: str, connection: str, eps: pd.DataFrame,
              acts: pd.DataFrame) -> CostRow:
    opening = acts["connections"] > 0
    per = eps["attempted_actions"].clip(lower=1)
    return CostRow(
        policy=policy, connection=connection, rounds=float(acts["rounds"].mean()),
        connections=float(acts["connections"].mean()), share_opening=float(opening.mean()),
        stall_opening_ms=float(acts.loc[opening, "stall_ms"].median()),
        stall_not_opening_ms=float(acts.loc[~opening, "stall_ms"].median()),
        phase_ms={p: float(acts[f"{p}_ms"].mean()) for p in PHASES},
        phase_kib={p: float((eps[f"{p}_bytes"] / per).median() / 1024)
                   for p in EPISODE_PHASES},
        kib_payload=_median(eps, "kib_per_action_payload"))


def _pair_finding(connection: str, pf: CostRow, bk: CostRow) -> str:
    tie = practical_tie(pf.stall_not_opening_ms, bk.stall_not_opening_ms)
    return (f"{connection}: PlanFence {fmt(pf.rounds, 2)} rounds and {fmt(pf.connections, 2)} "
            f"new connections per action, batched all-key {fmt(bk.rounds, 2)} and "
            f"{fmt(bk.connections, 2)}; actions that open a connection "
            f"{pct(pf.share_opening).lstrip('+')} vs {pct(bk.share_opening).lstrip('+')}; "
            f"median stall of the actions that open none {fmt(pf.stall_not_opening_ms, 0)} vs "
            f"{fmt(bk.stall_not_opening_ms, 0)} ms" + (" (a tie)." if tie else "."))


def cost_tables(run: Run, options: Options) -> list[Table]:
    episodes, actions = run.episodes, run.actions
    if "rounds" not in actions or actions["rounds"].isna().all():
        return []
    tables = []
    for network in slicing.networks(episodes):
        frame = cost_episodes(slicing.slice_for(episodes, free=("connection",),
                                                where={"network": network, "rho": 4.0}
                                                ).episodes)
        if frame.empty:
            continue
        acts = actions[actions["episode"].isin(frame["episode"])]
        found: list[CostRow] = []
        for policy in naming.ordered(frame["policy"].unique()):
            for connection in slicing.sorted_values(frame, "connection"):
                eps = frame[(frame["policy"] == policy) & (frame["connection"] == connection)]
                mine = acts[acts["episode"].isin(eps["episode"])]
                if not eps.empty and not mine.empty:
                    found.append(_cost_row(policy, str(connection), eps, mine))
        if not found:
            continue
        by = {(r.policy, r.connection): r for r in found}
        findings = [_pair_finding(c, by[("planfence", c)], by[("batched_all_key", c)])
                    for c in ("fresh", "reuse", "reuse_warm")
                    if ("planfence", c) in by and ("batched_all_key", c) in by]
        tables.append(layout(run, frame, [r.record() for r in found],
            name=f"table_e1_{network}",
            title=f"Explainable costs per action at rho = 4 on {network} (cost model E.1)",
            header=["Method", "Connection", "Rounds", "New connections",
                    "Actions opening one", "Stall opening / not (ms)",
                    "Query / fetch / revalidation ms", "Query / fetch / revalidation KiB",
                    "Planning KiB", "Commit / barrier KiB", "KiB w/o handshakes"],
            rows=[r.cells() for r in found],
            legend="Per protected action: sequential RPC rounds on the action path and new "
            "connections (means); the share of actions that opened a connection and the "
            "median stall of those that did and did not; mean time and median bytes by "
            "phase (planning, commits and barriers per action of the episode); the median "
            "episode traffic without channel handshakes.",
            findings=findings,
        ))
    return tables
