"""The ``act`` control op: one protected action at its executor, timed and accounted.

Rules (docs/architecture.md, "Control plane"):

1. Stall = elapsed time of ``validate`` minus replan time (generation, including a
   synthetic ``replan_delay_s``); bytes and connections are the executor's counter
   deltas over ``validate``; ``rounds`` and the per-phase bytes and times come from the
   env's round meter (``nodes.meter``).
2. ``deadline_s`` bounds the whole decision: a validation still running then is
   cancelled and the action is blocked with reason ``deadline: ...`` (never released).
3. ``issue_t_ns`` is when the outcome was decided (also for a block). The effect of a
   released action is recorded at ``effect_t_ns``, after ``effect_delay_s`` (the time a
   real effect would take; 0 by default). ``last_head_read_t_ns`` is when the final head
   read of the validation returned and ``last_head_round_t_ns`` when its round was sent,
   so a controller can tell a change before the final check from one during it and one
   between the check and the effect.
4. An RpcError or RemoteProtocolError escaping ``validate`` is a block with that reason;
   when it is a replacement role call's model endpoint that gave no answer
   (``EndpointUnavailable``) the reply also says so in ``unavailable`` (the controller
   aborts a live episode for it: infrastructure, not the model).
5. ``held`` is the newest local version of each declared key when the outcome was
   decided (what the executor's memory held: a fresh memory beside a stale plan).
6. ``versions`` (optional, key -> record ID) is the version set an application carries
   with the plan; it reaches the policy as ``ActionRequest.supplied``.
6. ``critical`` (optional, one of ``keys``) is the input the workload declares critical;
   it reaches the policy as ``ActionRequest.critical``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import trio

from nodes.control import ControlError, field
from nodes.node_env import NodeEnv
from nodes.transport import Counters
from protocols.env import ActionRequest
from protocols.errors import RemoteProtocolError, RpcError
from protocols.policies.base import Policy
from protocols.records import RECORD_ID_BYTES
from protocols.roles import EndpointUnavailable

log = logging.getLogger("nodes.node")


def seconds(args: Mapping[str, Any], name: str, default: float | None) -> float | None:
    """An optional duration argument: a finite number of seconds >= 0."""
    value = field(args, name, (int, float), default=default)
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ControlError(f"{name}: must be a finite number of seconds >= 0")
    return None if value is None else float(value)


def version_set(value: object) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, bytes) and len(v) == RECORD_ID_BYTES
            for k, v in value.items()):
        raise ControlError(f"versions: expected a map of key -> {RECORD_ID_BYTES}-byte "
                           "record ID")
    return tuple(sorted(value.items()))


async def run_act(env: NodeEnv, policy: Policy, counters: Counters, action: str,
                  roots: tuple[bytes, ...], keys: tuple[str, ...],
                  args: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one action and build the ``act`` reply (module rules)."""
    replan_delay_s = seconds(args, "replan_delay_s", 0.0) or 0.0
    deadline_s = seconds(args, "deadline_s", None)
    effect_delay_s = seconds(args, "effect_delay_s", 0.0) or 0.0
    supplied = version_set(args["versions"]) if "versions" in args else ()
    critical = field(args, "critical", str, default="")
    if critical and critical not in keys:
        raise ControlError("critical: must be one of the action's keys")
    request = ActionRequest(action, roots, keys, supplied, critical)
    before = counters.snapshot()
    replans_before = env.replans_made
    env.replan_ns = 0
    env.replan_delay_s = replan_delay_s
    env.meter.reset()
    started = time.monotonic_ns()
    released, reason, replans = False, "", 0
    unavailable = ""
    issued: tuple[bytes, ...] = ()
    inputs: Mapping[str, bytes] = {}
    try:
        with trio.move_on_after(math.inf if deadline_s is None else deadline_s) as scope:
            outcome = await policy.validate(env, request)
            released, reason = outcome.released, outcome.block_reason
            replans, issued, inputs = outcome.replans, outcome.issued_roots, outcome.inputs
        if scope.cancelled_caught:
            reason = f"deadline: no decision within {deadline_s:g} s"
            replans = env.replans_made - replans_before
    except (RpcError, RemoteProtocolError) as exc:  # fail closed
        released, reason = False, f"{type(exc).__name__}: {exc}"
        unavailable = str(exc) if isinstance(exc, EndpointUnavailable) else ""
        replans = env.replans_made - replans_before
        issued, inputs = (), {}
    finally:
        env.replan_delay_s = 0.0
    decided = time.monotonic_ns()
    held = {k: h.record_id for k in keys if (h := env.store.latest(k)) is not None}
    after = counters.snapshot()
    if released and effect_delay_s > 0:
        await trio.sleep(effect_delay_s)
    effect = time.monotonic_ns() if released else decided
    if not released:
        log.info("act %s blocked: %s", action, reason)
    return {
        **act_counts(released, replans, decided - started - env.replan_ns, before, after),
        "issued_roots": list(issued),
        "inputs": dict(inputs),
        "held": held,
        "started_t_ns": started,
        "issue_t_ns": decided,
        "effect_t_ns": effect,
        "last_head_read_t_ns": env.meter.last_head_read_ns,
        "last_head_round_t_ns": env.meter.last_head_round_ns,
        "block_reason": "" if released else (reason or "blocked"),
        **({"unavailable": unavailable} if unavailable else {}),
        **env.meter.report(),
    }


def act_counts(released: bool, replans: int, stall_ns: int, before: Mapping[str, int],
               after: Mapping[str, int]) -> dict[str, Any]:
    """The outcome and counted costs of one ``act`` reply: stall, and what the node's
    counters moved by between BEFORE and AFTER (every engine replies with these)."""
    return {
        "outcome": "released" if released else "blocked",
        "replans": replans,
        "stall_ms": stall_ns / 1e6,
        "bytes": (after["bytes_sent"] + after["bytes_received"]
                  - before["bytes_sent"] - before["bytes_received"]),
        "handshake_bytes": after["handshake_bytes_sent"] - before["handshake_bytes_sent"],
        "connections": after["connections_opened"] - before["connections_opened"],
        "rpc_timeouts": after["rpc_timeouts"] - before["rpc_timeouts"],
    }
