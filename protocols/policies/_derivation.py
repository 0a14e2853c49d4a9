"""What every derivation-current policy shares: the evidence, the predicate, the budget.

Rules (paper, Algorithm 1 and appendices C.3, E.3):

1. A pass captures C from the local store, reconstructs F from the candidate's roots,
   obtains H (the only step in which policies differ: :meth:`obtain_heads`), checks
   the answers, fetches-verifies-installs every H(x) != C(x), then decides.
2. Release only when F = C = H for every declared key. A mismatch asks for exactly one
   replan from the refreshed inputs; the replacement root (not the old root with a
   newer head substituted) is validated by a second, complete pass, which recaptures C.
3. The fetch of changed content happens before the exhausted-budget decision, so a
   second change during the replan is fetched and then blocks.
4. Fail closed: missing or conflicting evidence (:class:`EvidenceError`), failed
   calls (:class:`RpcError`) and bad answers (:class:`RemoteProtocolError`, which
   includes :class:`IntegrityError`) block the action with a reason; they are never
   raised out of ``validate``.
5. ``ActionOutcome.messages`` counts the requests this ``validate`` sent (each has
   exactly one response frame); an executor reads heads of keys it owns locally.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.errors import (
    ConflictError,
    IntegrityError,
    LocalProtocolError,
    RemoteProtocolError,
    RpcError,
)
from protocols.frontier import (
    EvidenceError,
    Verdict,
    capture,
    changed,
    decide,
    reconstruct,
)
from protocols.heads import unproducible
from protocols.policies.base import Policy
from protocols.records import RECORD_ID_BYTES, HeadInfo

T = TypeVar("T")

#: Everything that turns into a block instead of an exception.
BLOCKING_ERRORS = (EvidenceError, RpcError, RemoteProtocolError)


class Tally:
    """Counts the requests one operation sends (each is one request + one response)."""

    def __init__(self) -> None:
        self.requests = 0

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        self.requests += 1
        return await fn()


async def all_or_raise(env: PolicyEnv, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run calls concurrently; if any failed, re-raise the first failure (fail closed)."""
    results = await env.concurrently(calls)
    out: list[T] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out


@dataclass
class Evidence:
    """Heads H per declared key, and where to fetch each one's content from."""

    heads: dict[str, HeadInfo]
    sources: dict[str, str] = field(default_factory=dict)  # key -> peer (default: owner)


def block_reason(exc: BaseException) -> str:
    if isinstance(exc, EvidenceError):
        return f"evidence: {exc}"
    if isinstance(exc, RpcError):
        return f"unavailable: {type(exc).__name__}: {exc}"
    return f"integrity: {type(exc).__name__}: {exc}"


def known_versions(env: PolicyEnv, ids: Iterable[bytes]) -> list[HeadInfo]:
    """Envelopes of locally held records (the versions an answer must not contradict)."""
    out = []
    for rid in ids:
        record = env.store.get(rid)
        if record is not None:
            out.append(record.head)
    return out


def check_head(key: str, owner: str, head: HeadInfo | None,
               known: Iterable[HeadInfo], *, source: str) -> HeadInfo:
    """Response checks of appendix E.3: expected key and owner, valid ID, and no
    conflict with an owner-signed version we hold (same seq, other ID; or newer seq)."""
    if head is None:
        raise EvidenceError(f"{source} returned no head for {key!r}")
    if head.key != key or head.owner != owner:
        raise IntegrityError(f"{source} answered for {head.key!r}/{head.owner!r}, "
                             f"expected {key!r}/{owner!r}")
    if len(head.record_id) != RECORD_ID_BYTES or head.seq < 0:
        raise IntegrityError(f"{source} returned a malformed head for {key!r}")
    for version in known:
        if version.key != key:
            continue
        if version.seq == head.seq and version.record_id != head.record_id:
            raise ConflictError(f"{source} reports {key!r} seq {head.seq} with a different "
                                f"ID than the owner-signed record held locally")
        if version.seq > head.seq:
            raise IntegrityError(f"{source} reports {key!r} at seq {head.seq}, behind the "
                                 f"owner-signed seq {version.seq} held locally")
    return head


async def refresh(env: PolicyEnv, evidence: Evidence, captured: Mapping[str, bytes],
                  tally: Tally) -> None:
    """Fetch, verify and install every H(x) != C(x) not already held (line 17)."""
    wanted = [h for h in changed(captured, evidence.heads) if not env.store.has(h.record_id)]

    def fetcher(head: HeadInfo) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            peer = evidence.sources.get(head.key) or env.roster.owner_of(head.key)
            try:
                record = await tally.call(lambda: env.fetch(peer, head.record_id))
            except RpcError as exc:
                raise unproducible(head, peer, exc) from None
            if record.head != head:
                raise IntegrityError(f"record fetched for {head.key!r} does not match the "
                                     f"reported head envelope")
            env.store.install(record)
        return run

    await all_or_raise(env, [fetcher(h) for h in wanted])


def local_heads(env: PolicyEnv, keys: Iterable[str]) -> dict[str, HeadInfo]:
    """Heads of the keys this agent owns, read from its own store (no message)."""
    out = {}
    for key in keys:
        if env.roster.owners.get(key) == env.agent_id:
            head = env.store.head(key)
            if head is None:
                raise EvidenceError(f"owner {env.agent_id!r} has no head for {key!r}")
            out[key] = head
    return out


async def query_owners(env: PolicyEnv, keys: Sequence[str], known: list[HeadInfo],
                       tally: Tally, *, per_key: bool) -> dict[str, HeadInfo]:
    """Owner heads of ``keys``: own keys locally, others with one request per key
    (``per_key``) or one request per owner, all concurrently; answers checked."""
    heads = local_heads(env, keys)
    remote = [k for k in keys if k not in heads]
    groups: list[tuple[str, list[str]]]
    if per_key:
        groups = [(env.roster.owner_of(k), [k]) for k in remote]
    else:
        by_owner: dict[str, list[str]] = {}
        for k in remote:
            by_owner.setdefault(env.roster.owner_of(k), []).append(k)
        groups = sorted(by_owner.items())

    def asker(owner: str, ks: list[str]) -> Callable[[], Awaitable[dict[str, HeadInfo]]]:
        return lambda: tally.call(lambda: env.owner_heads(owner, ks))

    answers = await all_or_raise(env, [asker(o, ks) for o, ks in groups])
    for (owner, ks), answer in zip(groups, answers, strict=True):
        for k in ks:
            heads[k] = check_head(k, owner, answer.get(k), known, source=f"owner {owner!r}")
    return heads


def best_effort_inputs(env: PolicyEnv, request: ActionRequest) -> dict[str, bytes]:
    """The plan's frontier if it can be read, else {} (for controls that never block on it)."""
    try:
        return reconstruct(env.store.get, request.roots, request.declared).inputs
    except EvidenceError:
        return {}


#: Obtains H for one pass: (candidate, captured C, frontier F, tally) -> evidence.
ObtainHeads = Callable[[ActionRequest, Mapping[str, bytes], Mapping[str, bytes], Tally],
                       Awaitable[Evidence]]


async def verify_passes(env: PolicyEnv, request: ActionRequest, obtain: ObtainHeads, *,
                        compared: Sequence[str] | None = None,
                        on_first_pass: Callable[[Mapping[str, bytes], Evidence], None]
                        | None = None) -> ActionOutcome:
    """Rules 1-5 for one action: a pass, at most one replan, a second pass.

    ``compared`` limits the predicate to those declared keys (None: every declared key;
    a budgeted check compares only the inputs it checked); the replan then takes H on
    them and the local version elsewhere. ``on_first_pass`` sees F and the evidence of
    the first pass once it is refreshed (a policy's bookkeeping of what it found)."""
    tally = Tally()
    candidate = request
    inputs: dict[str, bytes] = {}

    def only(values: Mapping[str, bytes]) -> Mapping[str, bytes]:
        return values if compared is None else {k: values[k] for k in compared}

    for replans in range(2):  # the first pass, and one more after the single replan
        try:
            captured = capture(env.store, candidate.declared, env.roster)
            inputs = reconstruct(env.store.get, candidate.roots, candidate.declared).inputs
            evidence = await obtain(candidate, captured, inputs, tally)
            await refresh(env, evidence, captured, tally)
        except BLOCKING_ERRORS as exc:
            return ActionOutcome(False, replans, (), inputs,
                                 block_reason(exc), tally.requests)
        if replans == 0 and on_first_pass is not None:
            on_first_pass(inputs, evidence)
        heads = {k: h.record_id for k, h in evidence.heads.items()}
        decision = decide(only(inputs), only(captured), only(heads), replanned=replans > 0)
        if decision.verdict is Verdict.RELEASE:
            return ActionOutcome(True, replans, candidate.roots, inputs,
                                 messages=tally.requests)
        if decision.verdict is Verdict.BLOCK:
            return ActionOutcome(False, replans, (), inputs,
                                 decision.reason, tally.requests)
        candidate = await env.replan(candidate, {**captured, **decision.heads})
    raise LocalProtocolError("the decision rule asked for a second replan")


class DerivationPolicy(Policy):
    """Base of every derivation-current policy: only :meth:`obtain_heads` differs."""

    derivation_current = True

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        raise NotImplementedError

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        async def obtain(candidate: ActionRequest, captured: Mapping[str, bytes],
                         frontier: Mapping[str, bytes], tally: Tally) -> Evidence:
            return await self.obtain_heads(env, candidate, captured, frontier, tally)
        return await verify_passes(env, request, obtain)


def frontier_known(env: PolicyEnv, captured: Mapping[str, bytes],
                   frontier: Mapping[str, bytes]) -> list[HeadInfo]:
    """Owner-signed versions of the declared keys this pass already holds (C and F)."""
    return known_versions(env, [*captured.values(), *frontier.values()])


class OwnerQueryPolicy(DerivationPolicy):
    """A derivation-current policy that asks the owners directly at action time.

    Subclasses choose the scope of the query (:meth:`query_scope`) and whether it is
    one request per key or one per owner (``per_key``); only the declared keys are
    compared either way.
    """

    #: One request per key (False: one per owner over the keys in scope).
    per_key = True

    def query_scope(self, env: PolicyEnv, request: ActionRequest) -> list[str]:
        raise NotImplementedError

    async def obtain_heads(self, env: PolicyEnv, request: ActionRequest,
                           captured: Mapping[str, bytes], frontier: Mapping[str, bytes],
                           tally: Tally) -> Evidence:
        known = frontier_known(env, captured, frontier)
        heads = await query_owners(env, self.query_scope(env, request), known, tally,
                                   per_key=self.per_key)
        return Evidence({k: heads[k] for k in request.declared})
