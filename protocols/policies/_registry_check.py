"""What the two native-validator stand-ins share: a version set checked against one
logical registry (the paper's handoff evidence ablation, Tables 1a and G.1).

The paper holds a native validator fixed and varies only the evidence it is given: the
versions the executor's own session observed, or a version set the application carries
across the handoff. This testbed does not run that service. Its stand-ins keep what the
comparison needs: a single logical registry of current heads (the central metadata
directory, to which owners commit every head change, as for centralized lineage) and
a validator that compares a supplied version set with it. They are named for what they
do, not for the service they stand in for.

Rules:

1. A pass takes the policy's version set V (key -> record ID), asks the registry for the
   heads of V's keys (one ``dir_heads`` request) and checks the answers as PlanFence's.
   V = H on every key releases the candidate; an empty V has nothing to contradict and
   releases too (a session that read nothing detects nothing).
2. A mismatch is detected: the registry heads not held are fetched from their owners,
   verified and installed (the single refresh), the session notes it read them, and the
   recorded decision is replayed once from the registry heads of the declared keys; the
   replacement's version set is its inputs. A second mismatch blocks.
3. Neither stand-in reconstructs the plan's frontier to decide; ``inputs`` of the outcome
   is the frontier read best effort, so the controller can judge validity from the
   owners' logs like for every other policy. Failures block (fail closed), as
   everywhere.
"""

from __future__ import annotations

from dataclasses import replace

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.frontier import EvidenceError
from protocols.policies._derivation import (
    BLOCKING_ERRORS,
    Evidence,
    Tally,
    best_effort_inputs,
    block_reason,
    check_head,
    known_versions,
    refresh,
)
from protocols.policies.base import CommitsToDirectory
from protocols.records import HeadInfo


class RegistryValidator(CommitsToDirectory):
    """Base of the stand-ins: only :meth:`version_set` differs."""

    derivation_current = False

    @property
    def category(self) -> str:
        return self.NATIVE_STANDIN

    def version_set(self, env: PolicyEnv, request: ActionRequest) -> dict[str, bytes]:
        raise NotImplementedError

    async def _registry(self, env: PolicyEnv, keys: list[str], versions: dict[str, bytes],
                        tally: Tally) -> dict[str, HeadInfo]:
        answer = await tally.call(lambda: env.central_heads(keys))
        known = known_versions(env, versions.values())
        heads = {}
        for key in keys:
            if key not in answer:
                raise EvidenceError(f"the registry has no head for {key!r}")
            heads[key] = check_head(key, env.roster.owner_of(key), answer[key], known,
                                    source="registry")
        return heads

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        tally = Tally()
        candidate = request
        for replans in range(2):
            inputs = best_effort_inputs(env, candidate)
            try:
                versions = self.version_set(env, candidate)
                keys = sorted(set(versions) | (set(candidate.declared) if versions else set()))
                heads = await self._registry(env, keys, versions, tally) if keys else {}
                stale = sorted(k for k, rid in versions.items() if heads[k].record_id != rid)
                if not stale:
                    return ActionOutcome(True, replans, candidate.roots, inputs,
                                         messages=tally.requests)
                await refresh(env, Evidence(heads), versions, tally)
            except BLOCKING_ERRORS as exc:
                return ActionOutcome(False, replans, (), inputs, block_reason(exc),
                                     tally.requests)
            for key, head in heads.items():
                env.record_read(key, head.record_id)
            if replans:
                return ActionOutcome(False, replans, (), inputs,
                                     f"stale after replan: {', '.join(stale)} changed again",
                                     tally.requests)
            replayed = {k: heads[k].record_id for k in candidate.declared}
            replacement = await env.replan(candidate, replayed)
            candidate = replace(replacement, supplied=tuple(sorted(replayed.items())))
        raise AssertionError("unreachable: the loop returns on its second pass")
