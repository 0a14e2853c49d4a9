"""Judging one live task from the owners' head logs and the recorded role calls (pure).

Rules this module obeys (docs/live.md, "What the tables count"):

1. The grader's truth is the owner's head log: at any instant the requirement's head is
   one version, and :func:`testbed.campaign.live.correct_option` of that version is the
   correct option. Nothing a node claims is taken as truth, and the model never sees the
   grader's answer.
2. The primary action (the executor's protected action) is ``correct`` if its option is
   the correct one at its issue time, ``obsolete`` if it is the correct one of an
   earlier version (a stale plan acted on), ``incorrect`` otherwise; ``blocked`` if the
   policy refused it, ``model_failure`` if a role call it needed produced no decision.
3. Each issued auditor action is correct or incorrect at its own issue time; a correct
   one after a correct primary is redundant (the paper's "redundant auditor actions").
   The task succeeds when its primary is correct, no auditor action is incorrect and no
   role call failed.
4. C.4's post-hoc derivation endpoint comes from recorded parents only: the primary's
   lineage (its record, then the parents each role call recorded, transitively) reaches
   the initial requirement (``plan_from_initial``); the executor held a later version
   when the outcome was decided (``executor_held_revision``, from the act's ``held``).
5. An overlap is confirmed when the owner's update lands strictly inside the
   executor's replacement generation (between the call's start and end, all on
   CLOCK_MONOTONIC, which is system wide).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocols.roles import decision_option
from testbed.campaign.live import correct_option, task_content
from testbed.run.verdict import HeadLog, head_at, judge_invalid


@dataclass
class TaskTrace:
    """What the controller saw of one task (the live runner fills it in)."""

    key: str
    seed: int
    template: str
    failed: str = ""  # a planner or executor role call that produced no decision
    primary: dict[str, Any] | None = None  # the executor's act reply
    candidate: str = ""  # hex ID of the executor's action record
    auditor: dict[str, Any] | None = None  # the auditor's act reply (if it acted)
    overlap: bool = False  # the cell asks for an update during the replacement generation
    overlap_update_t_ns: int | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    started_ns: int = 0
    ended_ns: int = 0


def versions(head_log: Mapping[str, Sequence[Sequence[Any]]], key: str) -> dict[bytes, int]:
    """Record ID -> owner sequence of ``key``'s versions (from the owners' logs)."""
    out: dict[bytes, int] = {}
    for entries in head_log.values():
        for k, seq, rid, _ in entries:
            if str(k) == key:
                out[bytes(rid)] = int(seq)
    return out


def lineage(root: str, calls: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every record ID (hex) reachable from ``root`` through the calls' recorded parents."""
    parents = {str(c["record"]): [str(p) for p in c.get("parents", [])]
               for c in calls if c.get("record")}
    seen: set[str] = set()
    todo = [root]
    while todo:
        rid = todo.pop()
        if rid in seen:
            continue
        seen.add(rid)
        todo.extend(parents.get(rid, []))
    return seen


def judge_task(trace: TaskTrace, timeline: HeadLog, seqs: Mapping[bytes, int]
               ) -> dict[str, Any]:
    """The live columns of the task's row (module rules)."""
    key = trace.key

    def correct_at(t_ns: int) -> str | None:
        head = head_at(timeline, key, t_ns)
        seq = seqs.get(head) if head is not None else None
        return None if seq is None else correct_option(task_content(trace.seed,
                                                                    trace.template, seq - 1))

    earlier = {correct_option(task_content(trace.seed, trace.template, s - 1))
               for s in seqs.values()}
    decisions = {str(c["record"]): c.get("decision") for c in trace.calls if c.get("record")}
    reply = trace.primary
    released = reply is not None and reply["outcome"] == "released"
    issued = bytes(reply["issued_roots"][0]).hex() if released and reply else ""
    outcome, invalid = "blocked", False
    if trace.failed or (reply is not None and "ModelFailure" in str(reply.get("block_reason"))):
        outcome = "model_failure"
    elif released and reply is not None:
        option = decision_option(decisions.get(issued))
        right = correct_at(int(reply["issue_t_ns"]))
        outcome = ("correct" if option is not None and option == right
                   else "obsolete" if option in earlier else "incorrect")
        inputs = {str(k): bytes(v) for k, v in dict(reply.get("inputs") or {}).items()}
        invalid = judge_invalid(timeline, [key], inputs, int(reply["issue_t_ns"]))
    auditor_actions = redundant = wrong = 0
    if trace.auditor is not None and trace.auditor["outcome"] == "released":
        auditor_actions = 1
        root = bytes(trace.auditor["issued_roots"][0]).hex()
        option = decision_option(decisions.get(root))
        if option is not None and option == correct_at(int(trace.auditor["issue_t_ns"])):
            redundant = int(outcome == "correct")
        else:
            wrong = 1
    initial = next((rid.hex() for rid, seq in seqs.items() if seq == 1), "")
    held = dict((reply or {}).get("held") or {}).get(key)
    failures = sum(1 for c in trace.calls if c.get("error"))
    latencies = [float(c["latency_ms"]) for c in trace.calls if not c.get("error")]
    replans = [c for c in trace.calls if c.get("role") == "replan"]
    overlap = None
    if trace.overlap:
        t = trace.overlap_update_t_ns
        overlap = t is not None and any(int(c["started_t_ns"]) < t < int(c["ended_t_ns"])
                                        for c in replans)
    return {
        "invalid": invalid,
        "complete": outcome == "correct" and not invalid,
        "primary_outcome": outcome,
        "auditor_actions": auditor_actions,
        "redundant_auditor_actions": redundant,
        "auditor_incorrect": wrong,
        "task_success": outcome == "correct" and wrong == 0 and failures == 0,
        "plan_from_initial": bool(initial) and initial in lineage(issued or trace.candidate,
                                                                 trace.calls),
        "executor_held_revision": held is not None and seqs.get(bytes(held), 1) > 1,
        "overlap_confirmed": overlap,
        "role_calls": len(trace.calls),
        "completions": sum(int(c.get("completions", 0)) for c in trace.calls),
        "model_failures": failures,
        "corrections": sum(int(c.get("corrections", 0)) for c in trace.calls),
        "prompt_tokens": sum(int(c.get("prompt_tokens", 0)) for c in trace.calls),
        "completion_tokens": sum(int(c.get("completion_tokens", 0)) for c in trace.calls),
        "task_s": (trace.ended_ns - trace.started_ns) / 1e9,
        "role_call_ms_p50": statistics.median(latencies) if latencies else None,
        "replan_call_ms": float(replans[0]["latency_ms"]) if replans else None,
    }
