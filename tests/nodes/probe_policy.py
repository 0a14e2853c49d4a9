"""A test-only policy that exercises every PolicyEnv method between node processes.

Loaded into node processes with ``python -m nodes --plugin tests.nodes.probe_policy``.
It is a minimal derivation check for depth-0 plans (frontier = the plan's direct
parents), so the integration tests can check outcomes as well as counters:

- ``validate``: per-key owner heads (one request per key), then one batched request
  per owner for the same keys; fetch + install what differs from the local copy;
  release if plan parents = local = owner head, else replan once and recheck.
- ``on_update``: announce the new head to every other agent (one request each).
- ``at_unit_end``: ask every other agent for the versions it holds (one request each).
"""

from __future__ import annotations

from functools import partial

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.errors import IntegrityError
from protocols.policies import register
from protocols.policies._announce import ANNOUNCE, announce
from protocols.policies.base import Policy
from protocols.records import HeadInfo


@register
class ProbePolicy(Policy):
    name = "test_probe"
    rpcs = (ANNOUNCE,)  # the announcements are the shared policy-defined method

    async def on_update(self, env: PolicyEnv, head: HeadInfo) -> None:
        peers = env.roster.peers_of(env.agent_id)
        results = await env.concurrently([partial(announce, env, p, [head]) for p in peers])
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def at_unit_end(self, env: PolicyEnv, unit: int) -> None:
        keys = env.roster.keys
        for peer in env.roster.peers_of(env.agent_id):
            await env.replica_versions(peer, keys)

    def _frontier(self, env: PolicyEnv, request: ActionRequest) -> dict[str, bytes]:
        frontier: dict[str, bytes] = {}
        for root in request.roots:
            plan = env.store.get(root)
            if plan is None:
                raise IntegrityError("plan root missing")
            for parent in plan.parents:
                record = env.store.get(parent)
                if record is None:
                    raise IntegrityError("plan input missing")
                frontier[record.key] = parent
        return frontier

    async def _owner_heads(self, env: PolicyEnv, keys: tuple[str, ...]) -> dict[str, bytes]:
        per_key = await env.concurrently(
            [partial(env.owner_heads, env.roster.owner_of(k), [k]) for k in keys])
        by_owner: dict[str, list[str]] = {}
        for k in keys:
            by_owner.setdefault(env.roster.owner_of(k), []).append(k)
        batched = await env.concurrently(
            [partial(env.owner_heads, o, ks) for o, ks in by_owner.items()])
        heads: dict[str, HeadInfo] = {}
        for r in [*per_key, *batched]:
            if isinstance(r, BaseException):
                raise r
            for k, h in r.items():
                if heads.setdefault(k, h) != h:
                    raise IntegrityError(f"owner changed {k} between queries")
        for k, h in heads.items():
            local = env.store.latest(k)
            if local is None or local.record_id != h.record_id:
                env.store.install(await env.fetch(h.owner, h.record_id))
        return {k: h.record_id for k, h in heads.items()}

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        replans = 0
        while True:
            captured = {k: h.record_id for k in request.declared
                        if (h := env.store.latest(k)) is not None}
            frontier = self._frontier(env, request)
            heads = await self._owner_heads(env, request.declared)
            if frontier == captured == heads:
                return ActionOutcome(True, replans, request.roots, frontier)
            if replans:
                return ActionOutcome(False, replans, request.roots, frontier,
                                     block_reason="inputs changed again after replan")
            request = await env.replan(request, heads)
            replans += 1
