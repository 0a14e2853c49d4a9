"""Tables of the live studies: 1(b) (C.5), C.2, C.4's derivation endpoint, the live cohort
of appendix F, and what the role calls cost.

An arm is a policy with its executor's input exposure (``executor_inputs``); the overlap
condition is a column of its own. Every count is over scheduled tasks: an aborted task
(Infra.) and a task whose role call failed (model failure) stay in the denominators.
A run made against the stand-in model server says so in every legend: its counts describe
the harness and the policies with a rule-based decider, not a model. See docs/live.md.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.table_common import Options, layout
from testbed.report.tabular import Cell, Table, fmt

ARM_ORDER = ("owner_head_freshness", "centralized_lineage", "planfence")
STAND_IN_NOTE = ("Made against the testbed's stand-in model server (rule-based, not a "
                 "model): these counts show what the harness and the policies do with a "
                 "decider that follows its inputs, not how a model behaves.")
_LIVE = ["episode", "outcome", "invalid", "replans", "block_reason", "primary_outcome",
         "auditor_actions", "redundant_auditor_actions", "auditor_incorrect", "task_success",
         "plan_from_initial", "executor_held_revision", "overlap_confirmed", "role_calls",
         "completions", "model_failures", "corrections", "prompt_tokens",
         "completion_tokens", "task_s", "role_call_ms_p50", "replan_call_ms"]


def stand_in(run: Run) -> bool:
    return bool((run.manifest.get("model") or {}).get("stand_in"))


def _tasks(run: Run) -> pd.DataFrame:
    actions = run.actions[[c for c in _LIVE if c in run.actions]]
    frame = run.episodes.merge(actions, on="episode", how="left")
    for column in ("executor_inputs", "overlap"):
        if column not in frame:
            frame[column] = None
    frame["executor_inputs"] = frame["executor_inputs"].fillna("local")
    frame["overlap"] = frame["overlap"].fillna("none")
    return frame


def _arms(frame: pd.DataFrame) -> list[tuple[str, str]]:
    present = frame[["policy", "executor_inputs"]].drop_duplicates().itertuples(index=False)

    def key(arm: tuple[str, str]) -> tuple[int, int, str]:
        policy, inputs = arm
        rank = ARM_ORDER.index(policy) if policy in ARM_ORDER else len(ARM_ORDER)
        return (rank, int(inputs != "local"), policy)

    return sorted(((str(p), str(i)) for p, i in present), key=key)


def arm_title(policy: str, inputs: str) -> str:
    name = naming.display_name(policy)
    return f"{name}, fresh before generation" if inputs == "fresh" else name


def _count(part: pd.DataFrame, test: Callable[[pd.DataFrame], pd.Series]) -> int:
    return int(test(part).fillna(False).astype(bool).sum()) if not part.empty else 0


def _legend(run: Run, text: str) -> str:
    return f"{text} {STAND_IN_NOTE}" if stand_in(run) else text


def live_tables(run: Run, options: Options) -> list[Table]:
    kind = run.manifest.get("config", {}).get("kind")
    if kind != "live":
        return []
    tasks = _tasks(run)
    tables: list[Table] = []
    for network in slicing.networks(tasks):
        frame = tasks[tasks["network"] == network]
        plain = frame[frame["overlap"] == "none"]
        if not plain.empty:
            tables.append(_table_1b(run, plain, network))
            if (plain["executor_inputs"] == "fresh").any():
                tables.append(_table_c2(run, plain, network))
            tables.append(_table_c4(run, plain, network))
        tables.append(_costs(run, frame, network))
        if (frame["overlap"] == "in_generation").any():
            tables.append(_overlap(run, frame, network))
    return tables


def _table_1b(run: Run, frame: pd.DataFrame, network: str) -> Table:
    rows, records, findings = [], [], []
    for policy, inputs in _arms(frame):
        part = frame[(frame["policy"] == policy) & (frame["executor_inputs"] == inputs)]
        n = len(part)
        counts = part["primary_outcome"].value_counts()
        success = _count(part, lambda p: p["task_success"])
        invalid = _count(part, lambda p: p["invalid"] & (p["outcome"] == "released"))
        replanned = _count(part, lambda p: (p["replans"] > 0) & (p["outcome"] == "released"))
        redundant = int(part["redundant_auditor_actions"].fillna(0).sum())
        failures = int(part["model_failures"].fillna(0).sum())
        infra = int(part["aborted"].astype(bool).sum())
        outcomes = (f"{int(counts.get('obsolete', 0))} / {int(counts.get('correct', 0))} / "
                    f"{int(counts.get('blocked', 0))}")
        rows.append([Cell(arm_title(policy, inputs)), Cell(f"{success}/{n}"),
                     Cell(f"{invalid}/{n}"), Cell(outcomes), Cell(f"{replanned}/{n}"),
                     Cell(str(redundant)), Cell(str(failures)), Cell(str(infra))])
        records.append({"policy": policy, "executor_inputs": inputs, "tasks": n,
                        "task_success": success, "invalid_primary": invalid,
                        **{f"primary_{k}": int(counts.get(k, 0)) for k in
                           ("obsolete", "correct", "incorrect", "blocked", "model_failure")},
                        "successful_replans": replanned, "redundant_auditor_actions": redundant,
                        "model_failures": failures, "infra": infra})
        findings.append(f"{arm_title(policy, inputs)}: task success {success}/{n}, primary "
                        f"obsolete {int(counts.get('obsolete', 0))}, incorrect "
                        f"{int(counts.get('incorrect', 0))}, model failures {failures}.")
    return layout(run, frame, records, name=f"table_1b_{network}",
                  title=f"Table 1(b) layout: live workflows, one revision after planning, "
                        f"on {network}",
                  header=["Method", "Task success / scheduled", "Invalid primary / scheduled",
                          "Primary obsolete / correct / blocked", "Successful replans",
                          "Redundant auditor actions", "Model failures", "Infra."],
                  rows=rows, findings=findings,
                  legend=_legend(run, "One task per template (10 per family in the preset). "
                  "Primary: the executor's protected action, judged against the owner's head "
                  "at its issue (obsolete: right for a superseded requirement). Invalid: its "
                  "recorded inputs differ from the owners' heads. Successful replans: issued "
                  "after a replacement generation. Redundant auditor actions: valid actions "
                  "after a valid primary. Model failures: role calls without an acceptable "
                  "decision after every retry."))


def _table_c2(run: Run, frame: pd.DataFrame, network: str) -> Table:
    rows, records = [], []
    for policy, inputs in _arms(frame):
        part = frame[(frame["policy"] == policy) & (frame["executor_inputs"] == inputs)]
        n = len(part)
        correct = _count(part, lambda p: p["primary_outcome"] == "correct")
        success = _count(part, lambda p: p["task_success"])
        undone = int(part["auditor_incorrect"].fillna(0).sum())
        rows.append([Cell(arm_title(policy, inputs)), Cell(f"{correct}/{n}"),
                     Cell(f"{success}/{n}"), Cell(str(undone))])
        records.append({"policy": policy, "executor_inputs": inputs, "tasks": n,
                        "correct_primary": correct, "task_success": success,
                        "incorrect_auditor_actions": undone})
    return layout(run, frame, records, name=f"table_c2_{network}",
                  title=f"Table C.2 layout: an executor refreshed before generation, on "
                        f"{network}",
                  header=["Arm", "Correct primary / scheduled", "Task success / scheduled",
                          "Incorrect auditor actions"], rows=rows,
                  legend=_legend(run, "The fresh-before-generation executor reads the "
                  "owners' current requirement before its role call and has no derivation "
                  "check; its auditor keeps the original path (local state). An incorrect "
                  "auditor action undoes a correct primary."))


def _table_c4(run: Run, frame: pd.DataFrame, network: str) -> Table:
    rows, records = [], []
    for policy, inputs in _arms(frame):
        part = frame[(frame["policy"] == policy) & (frame["executor_inputs"] == inputs)]
        n = len(part)
        stale = part["plan_from_initial"].fillna(False).astype(bool)
        held = part["executor_held_revision"].fillna(False).astype(bool)
        right = part["primary_outcome"] == "correct"
        cases = {"stale_plan": int(stale.sum()),
                 "fresh_memory_stale_plan_incorrect": int((stale & held & ~right).sum()),
                 "fresh_memory_stale_plan_correct": int((stale & held & right).sum()),
                 "obsolete_memory_incorrect": int((stale & ~held & ~right).sum()),
                 "current_plan": int((~stale & ~part["aborted"].astype(bool)).sum())}
        rows.append([Cell(arm_title(policy, inputs)), Cell(f"{cases['stale_plan']}/{n}"),
                     Cell(str(cases["fresh_memory_stale_plan_incorrect"])),
                     Cell(str(cases["fresh_memory_stale_plan_correct"])),
                     Cell(str(cases["obsolete_memory_incorrect"])),
                     Cell(str(cases["current_plan"]))])
        records.append({"policy": policy, "executor_inputs": inputs, "tasks": n, **cases})
    return layout(run, frame, records, name=f"table_c4_{network}",
                  title=f"C.4 derivation endpoint (post hoc) from recorded parents, on "
                        f"{network}",
                  header=["Arm", "Acts from a plan citing the initial requirement",
                          "Holds revision, incorrect action", "Holds revision, correct action",
                          "Own copy obsolete, incorrect", "Current plan"], rows=rows,
                  legend=_legend(run, "From the recorded parents of the primary's lineage "
                  "(its record, then each role call's parents) and the act's report of what "
                  "the executor held when it decided; the model is never asked. The first "
                  "column counts tasks whose primary (or blocked candidate) derives from the "
                  "initial requirement; the next three split them as appendix C.4 does. An aborted "
                  "task (Infra.) is in neither the first nor the last column."))


def _costs(run: Run, frame: pd.DataFrame, network: str) -> Table:
    rows, records = [], []
    for overlap in sorted(frame["overlap"].unique()):
        for policy, inputs in _arms(frame):
            part = frame[(frame["policy"] == policy) & (frame["executor_inputs"] == inputs)
                         & (frame["overlap"] == overlap)]
            if part.empty:
                continue
            tokens = part["prompt_tokens"].fillna(0) + part["completion_tokens"].fillna(0)
            record = {
                "policy": policy, "executor_inputs": inputs, "overlap": overlap,
                "tasks": len(part), "task_s_median": part["task_s"].median(),
                "tokens_median": tokens.median(),
                "completions": int(part["completions"].fillna(0).sum()),
                "role_call_ms_median": part["role_call_ms_p50"].median(),
                "replan_call_ms_median": part["replan_call_ms"].median(),
                "corrections": int(part["corrections"].fillna(0).sum()),
                "model_failures": int(part["model_failures"].fillna(0).sum()),
                "model_kib_median": (part["model_bytes"] / 1024).median()
                if "model_bytes" in part else float("nan"),
                "kib_median": part["kib_per_action"].median(),
            }
            records.append(record)
            label = arm_title(policy, inputs) + ("" if overlap == "none"
                                                 else ", update in generation")
            rows.append([Cell(label), Cell(fmt(record["task_s_median"], 2)),
                         Cell(fmt(record["tokens_median"], 0)), Cell(str(record["completions"])),
                         Cell(fmt(record["role_call_ms_median"], 0)),
                         Cell(fmt(record["replan_call_ms_median"], 0)),
                         Cell(str(record["corrections"])), Cell(str(record["model_failures"])),
                         Cell(fmt(record["model_kib_median"], 1)),
                         Cell(fmt(record["kib_median"], 1))])
    return layout(run, frame, records, name=f"table_live_costs_{network}",
                  title=f"Live workflows: durations, tokens and completions on {network}",
                  header=["Arm", "Task s (median)", "Tokens per task (median)",
                          "Completions", "Role call ms (median)", "Replacement call ms",
                          "Corrections", "Model failures", "Model KiB per task",
                          "Data-plane KiB per task"], rows=rows,
                  legend=_legend(run, "Task duration: from the planner's call to the last "
                  "role's action. Tokens as the server reports them. Completions: model "
                  "responses, corrections included. Model KiB: the role calls' HTTP bytes "
                  "(their own column; with the server behind the central host they cross "
                  "the emulated links too)."))


def _overlap(run: Run, frame: pd.DataFrame, network: str) -> Table:
    rows, records = [], []
    for policy in [p for p in ARM_ORDER if p in set(frame["policy"])] + [
            p for p in naming.ordered(frame["policy"].unique()) if p not in ARM_ORDER]:
        for overlap, title in (("none", "initial-only control"),
                               ("in_generation", "update during the replacement call")):
            part = frame[(frame["policy"] == policy) & (frame["overlap"] == overlap)]
            if part.empty:
                continue
            n = len(part)
            confirmed = _count(part, lambda p: p["overlap_confirmed"]) \
                if overlap != "none" else None
            correct = _count(part, lambda p: p["primary_outcome"] == "correct")
            blocked = _count(part, lambda p: (p["primary_outcome"] == "blocked")
                             & (p["replans"] >= 1))
            rows.append([Cell(naming.display_name(policy)), Cell(title),
                         Cell("–" if confirmed is None else f"{confirmed}/{n}"),
                         Cell(f"{correct}/{n}"), Cell(f"{blocked}/{n}")])
            records.append({"policy": policy, "overlap": overlap, "attempts": n,
                            "overlap_confirmed": confirmed, "effect_correct_primary": correct,
                            "blocked_after_replan": blocked})
    return layout(run, frame, records, name=f"table_f_live_{network}",
                  title=f"Appendix F live cohort: an owner update during the replacement "
                        f"generation, on {network}",
                  header=["Policy", "Condition", "Overlap confirmed", "Correct primary",
                          "Blocked after the single replan"], rows=rows,
                  legend=_legend(run, "Overlap confirmed: the owner's commit (its head log) "
                  "lies between the start and the end of the executor's replacement call "
                  "(the call's recorded times), all on one monotonic clock. Unconfirmed "
                  "attempts (the generation ended first) stay in the denominators."))
