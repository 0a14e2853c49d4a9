"""Judging one live task (testbed/run/live_judge.py) from hand-made head logs and role
calls: the grader's truth is the owner's head at issue time, the C.4 endpoint comes from
recorded parents only, an overlap is confirmed from the clock (no process, no socket)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.campaign.live import correct_option, task_content
from testbed.run.live_judge import TaskTrace, judge_task, lineage, versions
from testbed.run.verdict import build_head_log

SEED, TEMPLATE, KEY = 7, "reservation-01", "req"
INITIAL, REVISION, UPDATE = b"\x01" * 8, b"\x02" * 8, b"\x03" * 8
PLAN, CHOSEN, REPLAN, AUDIT = "aa" * 8, "bb" * 8, "cc" * 8, "dd" * 8
REVISED_AT, ISSUED_AT = 2_000, 3_000
STATE_A = correct_option(task_content(SEED, TEMPLATE, 0))  # what the seed needs
STATE_B = correct_option(task_content(SEED, TEMPLATE, 1))  # what the revision needs
OTHER = "room-00"  # no version's answer


def head_logs(*, update_at: int | None = None) -> dict[str, list[list[Any]]]:
    """The owner's head log: the seed at 1000, the revision at 2000 (an update later)."""
    log: list[list[Any]] = [[KEY, 1, INITIAL, 1_000], [KEY, 2, REVISION, REVISED_AT],
                            ["other", 1, b"\x09" * 8, 500]]
    if update_at is not None:
        log.append([KEY, 3, UPDATE, update_at])
    return {"owner": log, "executor": [["mine", 1, b"\x08" * 8, 10]]}


def call(role: str, record: str, parents: list[bytes | str], option: str | None,
         **extra: Any) -> dict[str, Any]:
    decision = None if option is None else (
        {"tool": "confirm", "arguments": {}} if option == "confirm"
        else {"tool": "book_room", "arguments": {"option": option}})
    return {"role": role, "record": record, "decision": decision,
            "parents": [p.hex() if isinstance(p, bytes) else p for p in parents],
            "latency_ms": 10.0, "completions": 1, "prompt_tokens": 100,
            "completion_tokens": 10, "corrections": 0, "started_t_ns": 0,
            "ended_t_ns": 1, **extra}


def released(root: str, inputs: bytes, held: bytes, at: int = ISSUED_AT,
             replans: int = 0) -> dict[str, Any]:
    return {"outcome": "released", "issued_roots": [bytes.fromhex(root)],
            "issue_t_ns": at, "inputs": {KEY: inputs}, "held": {KEY: held},
            "replans": replans, "block_reason": ""}


def judge(trace: TaskTrace, *, update_at: int | None = None) -> dict[str, Any]:
    logs = head_logs(update_at=update_at)
    return judge_task(trace, build_head_log(logs), versions(logs, KEY))


def freshness_trace() -> TaskTrace:
    """The original path under owner-head freshness: a plan from the seed, the executor
    decides from it and its own stale copy, memory is refreshed only afterwards."""
    trace = TaskTrace(KEY, SEED, TEMPLATE, started_ns=0, ended_ns=2_500_000_000)
    trace.calls = [call("planner", PLAN, [INITIAL], STATE_A),
                   call("executor", CHOSEN, [PLAN, INITIAL], STATE_A)]
    trace.primary = released(CHOSEN, inputs=INITIAL, held=REVISION)
    trace.candidate = CHOSEN
    return trace


def repaired_trace(auditor: str | None = "confirm") -> TaskTrace:
    """A derivation-current policy: the replacement generation from the revision alone."""
    trace = TaskTrace(KEY, SEED, TEMPLATE)
    trace.calls = [call("planner", PLAN, [INITIAL], STATE_A),
                   call("executor", CHOSEN, [PLAN, INITIAL], STATE_A),
                   call("replan", REPLAN, [REVISION], STATE_B, latency_ms=40.0,
                        started_t_ns=2_100, ended_t_ns=2_900)]
    trace.primary = released(REPLAN, inputs=REVISION, held=REVISION, replans=1)
    trace.candidate = CHOSEN
    if auditor is not None:
        trace.calls.append(call("auditor", AUDIT, [REPLAN, REVISION], auditor))
        if auditor != "confirm":
            trace.auditor = released(AUDIT, inputs=REVISION, held=REVISION, at=4_000)
    return trace


def test_the_task_states_differ() -> None:
    assert STATE_A is not None
    assert STATE_B is not None
    assert STATE_A != STATE_B
    assert OTHER not in (STATE_A, STATE_B)


def test_a_stale_plan_acted_on_is_obsolete_and_invalid_though_memory_was_fresh() -> None:
    row = judge(freshness_trace())
    assert row["primary_outcome"] == "obsolete"
    assert row["invalid"]
    assert not row["complete"]
    assert not row["task_success"]
    # C.4's endpoint: it held the revision, yet its action descends from the seed
    assert row["executor_held_revision"]
    assert row["plan_from_initial"]
    assert row["replan_call_ms"] is None
    assert row["overlap_confirmed"] is None
    assert row["role_calls"] == 2
    assert row["prompt_tokens"] == 200
    assert row["task_s"] == pytest.approx(2.5)


def test_the_replacement_from_the_revision_is_correct_and_not_from_the_initial() -> None:
    row = judge(repaired_trace())
    assert row["primary_outcome"] == "correct"
    assert not row["invalid"]
    assert row["complete"]
    assert row["task_success"]
    assert not row["plan_from_initial"]
    assert row["replan_call_ms"] == 40.0
    assert row["auditor_actions"] == 0
    assert row["redundant_auditor_actions"] == 0
    assert row["auditor_incorrect"] == 0
    assert row["role_calls"] == 4
    assert row["completions"] == 4


def test_the_same_option_is_judged_by_the_head_at_its_issue_time() -> None:
    """The seed's answer issued before the revision is correct; after it, obsolete."""
    early = freshness_trace()
    assert early.primary is not None
    early.primary = released(CHOSEN, inputs=INITIAL, held=INITIAL, at=REVISED_AT - 1)
    row = judge(early)
    assert row["primary_outcome"] == "correct"
    assert not row["invalid"]
    assert not row["executor_held_revision"]
    assert row["task_success"]


def test_an_option_no_version_needs_is_incorrect() -> None:
    trace = repaired_trace()
    trace.calls[2] = call("replan", REPLAN, [REVISION], OTHER)
    row = judge(trace)
    assert row["primary_outcome"] == "incorrect"
    assert not row["invalid"]  # its inputs are current: derivation currency is not
    assert not row["task_success"]  # task correctness
    assert not row["complete"]


def test_an_agreeing_auditor_action_is_redundant_a_disagreeing_one_incorrect() -> None:
    agreeing = judge(repaired_trace(auditor=STATE_B))
    assert agreeing["auditor_actions"] == 1
    assert agreeing["redundant_auditor_actions"] == 1
    assert agreeing["auditor_incorrect"] == 0
    assert agreeing["task_success"]
    undoing = judge(repaired_trace(auditor=STATE_A))  # acts from its stale copy (C.2)
    assert undoing["auditor_actions"] == 1
    assert undoing["redundant_auditor_actions"] == 0
    assert undoing["auditor_incorrect"] == 1
    assert undoing["primary_outcome"] == "correct"
    assert not undoing["task_success"]


def test_a_correct_auditor_after_a_wrong_primary_is_not_redundant() -> None:
    trace = freshness_trace()
    trace.calls.append(call("auditor", AUDIT, [CHOSEN, REVISION], STATE_B))
    trace.auditor = released(AUDIT, inputs=REVISION, held=REVISION, at=4_000)
    row = judge(trace)
    assert row["auditor_actions"] == 1
    assert row["redundant_auditor_actions"] == 0
    assert row["auditor_incorrect"] == 0
    assert not row["task_success"]


def test_a_block_and_a_model_failure_are_neither_correct_nor_invalid() -> None:
    blocked = repaired_trace(auditor=None)
    blocked.primary = {"outcome": "blocked", "issued_roots": [], "issue_t_ns": ISSUED_AT,
                       "inputs": {}, "held": {KEY: REVISION}, "replans": 1,
                       "block_reason": "stale after replan: req"}
    row = judge(blocked)
    assert row["primary_outcome"] == "blocked"
    assert not row["invalid"]
    assert not row["task_success"]
    assert row["plan_from_initial"]  # the candidate it refused descends from the seed
    failed = repaired_trace(auditor=None)
    failed.primary = {**blocked.primary, "block_reason": "ModelFailure: schema violation"}
    assert judge(failed)["primary_outcome"] == "model_failure"
    gone = TaskTrace(KEY, SEED, TEMPLATE, failed="planner: no answer after 4 attempts")
    gone.calls = [call("planner", "", [INITIAL], None, error="no answer")]
    row = judge(gone)
    assert row["primary_outcome"] == "model_failure"
    assert row["model_failures"] == 1
    assert row["role_call_ms_p50"] is None


def test_a_failed_role_call_fails_the_task_even_when_the_primary_is_correct() -> None:
    trace = repaired_trace()
    trace.calls.append(call("auditor", "", [REPLAN, REVISION], None, error="timeout"))
    row = judge(trace)
    assert row["primary_outcome"] == "correct"
    assert row["model_failures"] == 1
    assert not row["task_success"]


def test_the_c4_endpoint_follows_recorded_parents_transitively() -> None:
    # a replacement whose recorded parent is the stale plan still descends from the seed
    trace = repaired_trace(auditor=None)
    trace.calls[2] = call("replan", REPLAN, [PLAN, REVISION], STATE_B)
    assert judge(trace)["plan_from_initial"]
    assert lineage(REPLAN, trace.calls) == {REPLAN, PLAN, REVISION.hex(), INITIAL.hex()}
    # a cycle in recorded parents terminates
    loop = [call("planner", PLAN, [CHOSEN], STATE_A), call("executor", CHOSEN, [PLAN], STATE_A)]
    assert lineage(PLAN, loop) == {PLAN, CHOSEN}


@pytest.mark.parametrize(("update_at", "confirmed"), [
    (2_500, True),  # inside the replacement generation (2100..2900)
    (2_100, False),  # at its start: not strictly inside
    (3_500, False),  # after it ended
])
def test_an_overlap_is_confirmed_only_strictly_inside_the_replacement_call(
        update_at: int, confirmed: bool) -> None:
    trace = repaired_trace(auditor=None)
    trace.overlap = True
    trace.overlap_update_t_ns = update_at
    trace.primary = {"outcome": "blocked", "issued_roots": [], "issue_t_ns": 3_600,
                     "inputs": {}, "held": {KEY: UPDATE}, "replans": 1,
                     "block_reason": "stale after replan: req"}
    row = judge(trace, update_at=update_at)
    assert row["overlap_confirmed"] is confirmed
    assert row["primary_outcome"] == "blocked"
    assert row["executor_held_revision"]


def test_an_overlap_cell_whose_update_never_came_is_not_confirmed() -> None:
    trace = repaired_trace(auditor=None)
    trace.overlap = True
    assert judge(trace)["overlap_confirmed"] is False


def test_versions_reads_only_the_key_from_every_owner() -> None:
    logs = head_logs(update_at=5_000)
    assert versions(logs, KEY) == {INITIAL: 1, REVISION: 2, UPDATE: 3}
    assert versions(logs, "absent") == {}
