"""The live-workflow control ops of a node: a model endpoint, role calls, handoffs.

Ops (docs/architecture.md, "Control plane"; docs/live.md has the workflow):

- ``configure_model`` {endpoint}: the node's model endpoint (``nodes.model_client``);
  from then on its executor replans by a role call (``nodes.role_calls`` rule 3).
- ``role`` {role, action, key, ...}: one role call and the record holding its decision.
  ``planner`` (``executor``, ``handoff``: agents given the plan chain) reads the owners'
  current requirement and plans from it (parent: that exact record); ``executor``
  (``roots``: the inherited plan) decides the primary action from the plan and the
  newest local version of ``key`` (parents: both); ``auditor`` (``primary``: the
  executor's issued record, installed here) reviews it against the newest local version
  of ``key`` and confirms or decides an action of its own (parents: both). A model
  failure is a reply with ``failed`` (the controller counts it), never a guessed decision;
  an endpoint that gave no answer at all (``EndpointUnavailable``) is a reply with
  ``unavailable`` instead (the controller aborts the episode: infrastructure, not model).
- ``handoff`` {to, ids}: install these locally held records at ``to`` (data plane).
- ``role_calls``: the role calls made since the last drain (prompt digest, responses,
  decision, parents, latency, tokens; ``nodes.role_calls`` rule 2).
- ``wait_role`` {role, after_t_ns, timeout_s}: block until a call of ``role`` starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from nodes.control import ControlError, field
from nodes.node_env import NodeEnv
from nodes.role_calls import RoleCaller, make_replanner, requirement_of
from nodes.store import SqliteStore
from nodes.transport import Counters
from protocols.planning import derive_plan, install_batches, next_version, plan_content
from protocols.records import RECORD_ID_BYTES, Record
from protocols.roles import (
    EndpointUnavailable,
    ModelFailure,
    build_prompt,
    canonical_json,
    decision_option,
    task_document,
)

LIVE_ROLES = ("planner", "executor", "auditor")
MAX_WAIT_S = 600.0


class LiveOps:
    """Mixed into ``nodes.node.Node``: the ops above over its env and store."""

    env: NodeEnv | None
    store: SqliteStore | None
    counters: Counters
    caller: RoleCaller | None = None

    # --- lifecycle -------------------------------------------------------------------
    def attach_live(self, env: NodeEnv) -> None:
        """A new episode's env: live executors replan by role calls; the log restarts."""
        if self.caller is not None:
            self.caller.log.clear()
            env.replanner = make_replanner(self.caller, env.identity, env.store)

    async def close_live(self) -> None:
        if self.caller is not None:
            await self.caller.client.aclose()
            self.caller = None

    def _live(self) -> tuple[NodeEnv, SqliteStore, RoleCaller]:
        if self.env is None or self.store is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        if self.caller is None:
            raise ControlError("op: no model endpoint (send configure_model first)")
        return self.env, self.store, self.caller

    # --- ops -------------------------------------------------------------------------
    async def op_configure_model(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self.env is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        # httpx only in the nodes of live campaigns (it adds a second to a loaded start)
        from nodes.model_client import Endpoint, EndpointError, ModelClient

        try:
            endpoint = Endpoint.from_args(field(args, "endpoint", dict))
        except EndpointError as exc:
            raise ControlError(str(exc)) from None
        await self.close_live()
        self.caller = RoleCaller(ModelClient(endpoint), self.env.agent_id)
        self.attach_live(self.env)
        return {}

    async def op_role_calls(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"calls": [] if self.caller is None else self.caller.drain()}

    async def op_wait_role(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, _, caller = self._live()
        role = field(args, "role", str)
        after = field(args, "after_t_ns", int, default=0)
        timeout_s = float(field(args, "timeout_s", (int, float), default=60.0))
        if not 0 < timeout_s <= MAX_WAIT_S:
            raise ControlError(f"timeout_s: must be in (0, {MAX_WAIT_S:g}]")
        return {"t_ns": await caller.wait_started(role, after_ns=after, timeout_s=timeout_s)}

    async def op_handoff(self, args: Mapping[str, Any]) -> dict[str, Any]:
        env, store, _ = self._live_env()
        to = field(args, "to", str)
        if to not in env.roster.members:
            raise ControlError(f"to: {to!r} is not a roster member")
        records = [self._held(store, rid, "ids") for rid in _ids(field(args, "ids", list), "ids")]
        before = self._traffic_now()
        if to != env.agent_id:
            for batch in install_batches(records):
                await env.install_at(to, batch)
        return {"bytes": self._traffic_now() - before}

    async def op_role(self, args: Mapping[str, Any]) -> dict[str, Any]:
        env, store, caller = self._live()
        role = field(args, "role", str, allowed=LIVE_ROLES)
        action = field(args, "action", str)
        key = field(args, "key", str)
        if key not in env.roster.owners:
            raise ControlError(f"key: {key!r} is not a shared key")
        before = self._traffic_now()
        try:
            if role == "planner":
                out = await self._planner(env, caller, action, key, args)
            elif role == "executor":
                out = await self._executor(env, store, caller, action, key, args)
            else:
                out = await self._auditor(env, store, caller, action, key, args)
        except EndpointUnavailable as exc:
            out = {"unavailable": str(exc)}
        except ModelFailure as exc:
            out = {"failed": str(exc)}
        return {**out, "bytes": self._traffic_now() - before}

    # --- the roles ---------------------------------------------------------------------
    async def _planner(self, env: NodeEnv, caller: RoleCaller, action: str, key: str,
                       args: Mapping[str, Any]) -> dict[str, Any]:
        executor = field(args, "executor", str)
        handoff = _agents(field(args, "handoff", list, default=[]))
        for agent in (executor, *handoff):
            if agent not in env.roster.members:
                raise ControlError(f"executor/handoff: {agent!r} is not a roster member")
        entries = []

        async def decide(inputs: Sequence[Record]) -> str:
            _, doc = requirement_of(inputs)
            prompt = build_prompt("planner", str(doc["family"]), requirement=doc,
                                  action=action)
            decision, entry = await caller.decide(prompt, action, [r.id for r in inputs])
            entries.append(entry)
            return canonical_json(decision)

        plan = await derive_plan(env, action=action, executor=executor, keys=[key], depth=0,
                                 decision="", decide=decide)
        entries[0].record = plan.root.hex()
        for agent in handoff:
            if agent not in (executor, env.agent_id):
                for batch in install_batches(plan.chain):
                    await env.install_at(agent, batch)
        for k, rid in plan.inputs.items():
            env.record_read(k, rid)
        return {"record": plan.root, "inputs": plan.inputs,
                "decision": json.loads(plan_decision(plan.chain[-1]))}

    async def _executor(self, env: NodeEnv, store: SqliteStore, caller: RoleCaller,
                        action: str, key: str, args: Mapping[str, Any]) -> dict[str, Any]:
        roots = _ids(field(args, "roots", list), "roots")
        if len(roots) != 1:
            raise ControlError("roots: expected exactly one plan root")
        plan = self._held(store, roots[0], "roots")
        requirement = self._latest(store, key)
        doc = task_document(requirement.content)
        inherited = json.loads(plan_decision(plan))
        option = decision_option(inherited)
        prompt = build_prompt("executor", str(doc["family"]), requirement=doc, action=action,
                              plan=inherited, extra_options=[option] if option else [])
        decision, entry = await caller.decide(prompt, action, [plan.id, requirement.id])
        record = self._own(env, store, f"action/{action}", [plan.id, requirement.id],
                           action, requirement, decision)
        entry.record = record.id.hex()
        return {"record": record.id, "decision": decision, "given": {key: requirement.id}}

    async def _auditor(self, env: NodeEnv, store: SqliteStore, caller: RoleCaller,
                       action: str, key: str, args: Mapping[str, Any]) -> dict[str, Any]:
        primary = self._held(store, _one_id(field(args, "primary", bytes)), "primary")
        requirement = self._latest(store, key)
        doc = task_document(requirement.content)
        prompt = build_prompt("auditor", str(doc["family"]), requirement=doc, action=action,
                              primary=json.loads(plan_decision(primary)))
        decision, entry = await caller.decide(prompt, action, [primary.id, requirement.id])
        out: dict[str, Any] = {"decision": decision, "given": {key: requirement.id},
                               "record": None}
        if decision_option(decision) is not None:
            record = self._own(env, store, f"audit/{action}", [primary.id, requirement.id],
                               action, requirement, decision)
            entry.record = record.id.hex()
            out["record"] = record.id
        return out

    # --- helpers -----------------------------------------------------------------------
    def _live_env(self) -> tuple[NodeEnv, SqliteStore, RoleCaller | None]:
        if self.env is None or self.store is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        return self.env, self.store, self.caller

    def _traffic_now(self) -> int:
        return self.counters.bytes_sent + self.counters.bytes_received

    @staticmethod
    def _held(store: SqliteStore, rid: bytes, name: str) -> Record:
        record = store.get(rid)
        if record is None:
            raise ControlError(f"{name}: record {rid.hex()[:16]} is not held here")
        return record

    @staticmethod
    def _latest(store: SqliteStore, key: str) -> Record:
        latest = store.latest(key)
        record = None if latest is None else store.get(latest.record_id)
        if record is None:
            raise ControlError(f"key: no version of {key!r} is held here")
        return record

    @staticmethod
    def _own(env: NodeEnv, store: SqliteStore, key: str, parents: Sequence[bytes],
             action: str, requirement: Record, decision: Mapping[str, Any]) -> Record:
        record = next_version(env.identity, store, key, parents, "action",
                              plan_content(action, [requirement], canonical_json(decision)))
        store.install(record)
        return record


def plan_decision(record: Record) -> str:
    """The decision text a plan or action record holds (``protocols.planning`` rule 3)."""
    try:
        body = msgpack.unpackb(record.content, raw=False)
        decision = body["decision"]
        json.loads(decision)
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise ControlError(f"record {record.id.hex()[:16]} holds no role decision ({exc})"
                           ) from None
    return str(decision)


def _ids(value: object, name: str) -> list[bytes]:
    if not isinstance(value, list) or not all(
            isinstance(v, bytes) and len(v) == RECORD_ID_BYTES for v in value):
        raise ControlError(f"{name}: expected a list of {RECORD_ID_BYTES}-byte record IDs")
    return list(value)


def _one_id(value: bytes) -> bytes:
    if len(value) != RECORD_ID_BYTES:
        raise ControlError(f"primary: expected a {RECORD_ID_BYTES}-byte record ID")
    return value


def _agents(value: list[Any]) -> list[str]:
    if not all(isinstance(v, str) and v for v in value):
        raise ControlError("handoff: expected a list of agent names")
    return list(value)
