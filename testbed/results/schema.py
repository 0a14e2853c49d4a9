"""The result columns: one schema for the writer (run directory), the loader and the
reports.

A row is the cell's columns, the episode's identity columns, then what the runner
measured. The runner hands back exactly :data:`RUNNER_ACTION_FIELDS` per protected
action and :data:`RUNNER_EPISODE_FIELDS` per episode; the campaign loop adds the rest.
Column meanings are listed in docs/campaigns.md ("Result columns").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

#: The version of the run directory's layout and columns the manifest records
#: (``schema_version``): 2 adds the episode column ``session`` and per-session code
#: provenance; runs without the field are version 1. ``testbed verify`` reads both.
RESULT_SCHEMA_VERSION = 2

#: Columns that identify a cell (the configuration an episode ran under).
CELL_COLUMNS: tuple[str, ...] = (
    "campaign", "cell", "policy", "network", "backend", "trace_offset_s", "connection",
    "agents", "keys", "deps", "rho", "tier", "units", "batch",
)
#: Study settings of single-action trials (null in other campaigns; not strata of the
#: generic tables, the study tables read them).
STUDY_COLUMNS: tuple[str, ...] = ("replan_delay_s", "update_rate_per_s", "update_target",
                                 "scenario", "executor_inputs", "overlap")
#: Columns identifying the episode and its schedule; ``attempt`` numbers the runs of one
#: episode (repeats and reruns, 1 upward; null in runs made before attempts existed).
EPISODE_ID_COLUMNS: tuple[str, ...] = ("episode", "family", "template", "schedule_digest",
                                      "attempt")

#: Per protected action, written by the runner (every one required).
RUNNER_ACTION_FIELDS: tuple[str, ...] = (
    "action", "outcome", "invalid", "complete", "replans", "stall_ms", "bytes", "connections",
    "block_reason", "rpc_timeouts",
)
#: Per protected action, written by the runner when it can say (explainable costs, and
#: the outcome of single-action trials; a trial may also name who actually planned and
#: executed when its scenario moves a role, e.g. same-session planning).
COST_ACTION_FIELDS: tuple[str, ...] = (
    "rounds", "query_bytes", "fetch_bytes", "revalidation_bytes", "query_ms", "fetch_ms",
    "revalidation_ms", "handshake_bytes", "handshake_rounds", "exchanges",
)
TRIAL_ACTION_FIELDS: tuple[str, ...] = (
    "trial_outcome", "relevant_updates", "unrelated_updates", "action_s", "effect_lag_ms",
    "gap_ms", "planner", "executor",
)
#: Per task of a live workflow (``testbed.run.live``; docs/live.md has the meanings).
LIVE_ACTION_FIELDS: tuple[str, ...] = (
    "primary_outcome", "auditor_actions", "redundant_auditor_actions", "auditor_incorrect",
    "task_success", "plan_from_initial", "executor_held_revision", "overlap_confirmed",
    "role_calls", "completions", "model_failures", "corrections", "prompt_tokens",
    "completion_tokens", "task_s", "role_call_ms_p50", "replan_call_ms",
)
#: Per action of a command workload (your own program's metrics, docs/own-programs.md):
#: the host that reported it, its ``ok``, its time since replay time 0, and the other
#: fields it reported (a JSON object).
COMMAND_ACTION_FIELDS: tuple[str, ...] = ("host", "ok", "t_ms", "metrics")
RUNNER_ACTION_OPTIONAL: tuple[str, ...] = (*COST_ACTION_FIELDS, *TRIAL_ACTION_FIELDS,
                                           *LIVE_ACTION_FIELDS, *COMMAND_ACTION_FIELDS)
#: Per episode, explainable costs: traffic without channel handshakes, bytes by phase
#: (their sum is the episode's traffic; docs/campaigns.md), and the sequential rounds
#: the barriers and commits waited for.
COST_EPISODE_FIELDS: tuple[str, ...] = (
    "kib_per_action_payload", "handshake_bytes", "setup_bytes", "planning_bytes",
    "query_bytes", "fetch_bytes", "revalidation_bytes", "barrier_bytes", "commit_bytes",
    "rounds_per_action", "barrier_rounds", "barrier_handshake_rounds", "commit_rounds",
    "commit_handshake_rounds",
)
#: What the links did in an episode (the runner may leave them out: null where a backend
#: cannot say, e.g. netem's queueing delay, or loopback's everything). Per direction over
#: every host; the emulator's release lateness is its own health (docs/emulator.md).
LINK_EPISODE_FIELDS: tuple[str, ...] = (
    "link_up_qdelay_p50_ms", "link_up_qdelay_p95_ms", "link_down_qdelay_p50_ms",
    "link_down_qdelay_p95_ms", "link_up_utilisation", "link_down_utilisation",
    "link_up_drops", "link_down_drops", "emulator_late_p99_ms", "emulator_late_max_ms",
    "link_log",
)
#: Whether something else on the host took the CPU from the episode (testbed/run/
#: disturbance.py): the nodes' own scheduling delay, the host's busy and steal shares,
#: and the verdict with its reason.
DISTURBANCE_FIELDS: tuple[str, ...] = (
    "node_runq_wait_ms", "node_cpu_ms", "node_oversleep_p99_ms", "node_oversleep_max_ms",
    "host_busy_pct", "host_steal_pct", "host_load_1m", "disturbed", "disturbed_reason",
)
#: Per episode of a command workload (JSON objects): bytes, packets and drops per host
#: and direction from the link counters, how each program ended, and the programs'
#: ``episode`` metrics.
COMMAND_EPISODE_FIELDS: tuple[str, ...] = ("link_host_bytes", "programs", "metrics")
#: Per episode, written by the runner (every one required for a completed episode, but
#: for :data:`RUNNER_EPISODE_OPTIONAL`).
#: Bytes of the role calls (HTTP to the model server, both directions): a traffic column
#: of its own, never part of the data-plane columns (live workflows only).
MODEL_EPISODE_FIELDS: tuple[str, ...] = ("model_bytes",)
#: The history checker's verdicts per episode (testbed/results/history.py): stale
#: actions (in the validation window included), those in the window, those whose
#: executor already held the newer version, and the lateness of the stale ones.
HISTORY_EPISODE_FIELDS: tuple[str, ...] = (
    "stale_actions", "stale_in_window_actions", "fresh_memory_stale_plan",
    "stale_late_p50_ms", "stale_late_max_ms")
#: The calibration a simulated episode charged its nodes' service times from (its id,
#: ``testbed.sim.calibration``; null for episodes on real nodes).
SIM_EPISODE_FIELDS: tuple[str, ...] = ("sim_calibration",)
RUNNER_EPISODE_FIELDS: tuple[str, ...] = (
    "stall_ms_per_action", "stall_action_ms", "stall_barrier_ms", "stall_commit_ms",
    "kib_per_action", "connections", "link_bytes", "wall_s", "replay_s",
    "congestion_control", *COST_EPISODE_FIELDS, "rpc_timeouts", "equivocations",
    *LINK_EPISODE_FIELDS, *DISTURBANCE_FIELDS,
    *MODEL_EPISODE_FIELDS,
    *COMMAND_EPISODE_FIELDS,
    *HISTORY_EPISODE_FIELDS,
    *SIM_EPISODE_FIELDS,
)
RUNNER_EPISODE_OPTIONAL: tuple[str, ...] = ("wall_s", "replay_s", "congestion_control",
                                            "equivocations",
                                            *COST_EPISODE_FIELDS, *LINK_EPISODE_FIELDS,
                                            *DISTURBANCE_FIELDS, *MODEL_EPISODE_FIELDS,
                                            *COMMAND_EPISODE_FIELDS,
                                            *HISTORY_EPISODE_FIELDS,
                                            *SIM_EPISODE_FIELDS)

_CELL_TYPES: dict[str, pa.DataType] = {
    "campaign": pa.string(), "cell": pa.string(), "policy": pa.string(),
    "network": pa.string(), "backend": pa.string(), "trace_offset_s": pa.float64(),
    "connection": pa.string(), "agents": pa.int64(), "keys": pa.int64(), "deps": pa.int64(),
    "rho": pa.float64(), "tier": pa.string(), "units": pa.int64(), "batch": pa.int64(),
    "replan_delay_s": pa.float64(), "update_rate_per_s": pa.float64(),
    "update_target": pa.string(), "scenario": pa.string(),
    "executor_inputs": pa.string(), "overlap": pa.string(),
    "episode": pa.string(), "family": pa.string(), "template": pa.string(),
    "schedule_digest": pa.string(), "attempt": pa.int64(),
}
_ACTION_TYPES: dict[str, pa.DataType] = {
    "unit": pa.int64(), "planner": pa.string(), "executor": pa.string(),
    "action": pa.string(), "outcome": pa.string(), "invalid": pa.bool_(),
    "complete": pa.bool_(), "replans": pa.int64(), "stall_ms": pa.float64(),
    "bytes": pa.int64(), "connections": pa.int64(), "block_reason": pa.string(),
    "rpc_timeouts": pa.int64(),
    "rounds": pa.int64(), "query_bytes": pa.int64(), "fetch_bytes": pa.int64(),
    "revalidation_bytes": pa.int64(), "query_ms": pa.float64(), "fetch_ms": pa.float64(),
    "revalidation_ms": pa.float64(), "handshake_bytes": pa.int64(),
    "handshake_rounds": pa.int64(), "exchanges": pa.int64(),
    "trial_outcome": pa.string(), "relevant_updates": pa.int64(),
    "unrelated_updates": pa.int64(), "action_s": pa.float64(), "effect_lag_ms": pa.float64(),
    "gap_ms": pa.float64(),
    "primary_outcome": pa.string(), "auditor_actions": pa.int64(),
    "redundant_auditor_actions": pa.int64(), "auditor_incorrect": pa.int64(),
    "task_success": pa.bool_(), "plan_from_initial": pa.bool_(),
    "executor_held_revision": pa.bool_(), "overlap_confirmed": pa.bool_(),
    "role_calls": pa.int64(), "completions": pa.int64(), "model_failures": pa.int64(),
    "corrections": pa.int64(), "prompt_tokens": pa.int64(), "completion_tokens": pa.int64(),
    "task_s": pa.float64(), "role_call_ms_p50": pa.float64(), "replan_call_ms": pa.float64(),
    "host": pa.string(), "ok": pa.bool_(), "t_ms": pa.float64(), "metrics": pa.string(),
}
_EPISODE_TYPES: dict[str, pa.DataType] = {
    "seed": pa.int64(), "scheduled_actions": pa.int64(), "attempted_actions": pa.int64(),
    "updates": pa.int64(), "aborted": pa.bool_(), "abort_reason": pa.string(),
    "stall_ms_per_action": pa.float64(), "stall_action_ms": pa.float64(),
    "stall_barrier_ms": pa.float64(), "stall_commit_ms": pa.float64(),
    "kib_per_action": pa.float64(), "connections": pa.int64(), "link_bytes": pa.int64(),
    "wall_s": pa.float64(), "replay_s": pa.float64(), "congestion_control": pa.string(),
    "kib_per_action_payload": pa.float64(), "handshake_bytes": pa.int64(),
    "setup_bytes": pa.int64(), "planning_bytes": pa.int64(), "query_bytes": pa.int64(),
    "fetch_bytes": pa.int64(), "revalidation_bytes": pa.int64(), "barrier_bytes": pa.int64(),
    "commit_bytes": pa.int64(), "rounds_per_action": pa.float64(),
    "barrier_rounds": pa.int64(), "barrier_handshake_rounds": pa.int64(),
    "commit_rounds": pa.int64(), "commit_handshake_rounds": pa.int64(),
    "worker": pa.string(), "session": pa.int64(), "rpc_timeouts": pa.int64(),
    "equivocations": pa.int64(),
    "link_up_qdelay_p50_ms": pa.float64(), "link_up_qdelay_p95_ms": pa.float64(),
    "link_down_qdelay_p50_ms": pa.float64(), "link_down_qdelay_p95_ms": pa.float64(),
    "link_up_utilisation": pa.float64(), "link_down_utilisation": pa.float64(),
    "link_up_drops": pa.int64(), "link_down_drops": pa.int64(),
    "emulator_late_p99_ms": pa.float64(), "emulator_late_max_ms": pa.float64(),
    "link_log": pa.string(), "model_bytes": pa.int64(), "repeat": pa.int64(),
    "node_runq_wait_ms": pa.float64(), "node_cpu_ms": pa.float64(),
    "node_oversleep_p99_ms": pa.float64(), "node_oversleep_max_ms": pa.float64(),
    "host_busy_pct": pa.float64(), "host_steal_pct": pa.float64(),
    "host_load_1m": pa.float64(), "disturbed": pa.bool_(), "disturbed_reason": pa.string(),
    "link_host_bytes": pa.string(), "programs": pa.string(), "metrics": pa.string(),
    "stale_actions": pa.int64(), "stale_in_window_actions": pa.int64(),
    "fresh_memory_stale_plan": pa.int64(), "stale_late_p50_ms": pa.float64(),
    "stale_late_max_ms": pa.float64(), "sim_calibration": pa.string(),
}
ACTION_SCHEMA = pa.schema([*(pa.field(c, _CELL_TYPES[c]) for c in _CELL_TYPES),
                           *(pa.field(c, t) for c, t in _ACTION_TYPES.items())])
EPISODE_SCHEMA = pa.schema([*(pa.field(c, _CELL_TYPES[c]) for c in _CELL_TYPES),
                            *(pa.field(c, t) for c, t in _EPISODE_TYPES.items())])
ACTION_COLUMNS: tuple[str, ...] = tuple(ACTION_SCHEMA.names)
EPISODE_COLUMNS: tuple[str, ...] = tuple(EPISODE_SCHEMA.names)

#: Columns that identify a configuration (a stratum of a report) apart from the policy.
STRATUM_COLUMNS: tuple[str, ...] = tuple(c for c in CELL_COLUMNS
                                         if c not in ("campaign", "cell", "policy"))
#: Columns that fix a workload schedule (identical across policies and connections).
SCHEDULE_COLUMNS: tuple[str, ...] = ("agents", "keys", "deps", "rho", "units", "tier",
                                     "family", "template")


class ResultRowError(Exception):
    """The runner handed back rows that break the result-column contract (a runner bug)."""


def rows_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, what: str) -> pa.Table:
    """Rows as an Arrow table of SCHEMA; a value that does not fit is a ResultRowError."""
    try:
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise ResultRowError(f"{what}: a value does not fit the column types: {exc}") from exc


def check_fields(row: Mapping[str, Any], required: Iterable[str], allowed: Iterable[str],
                 what: str) -> None:
    """Every ``required`` field present and nothing outside ``allowed`` (one-line error)."""
    missing = [f for f in required if f not in row]
    if missing:
        raise ResultRowError(f"{what}: missing field(s) {', '.join(missing)}")
    extra = sorted(set(row) - set(allowed))
    if extra:
        raise ResultRowError(f"{what}: unknown field(s) {', '.join(extra)}; "
                             f"allowed: {', '.join(allowed)}")
