"""The ``announce`` method, a policy-defined RPC shared by metadata sync and adaptive.

An owner sends head envelopes (metadata only) of keys it owns; the receiver keeps
them as its synced view (``LocalStore.set_synced_head``: never lowered). The body is
``{"heads": [HeadInfo, 1..4096]}``, the answer ``{"ack": true}``: the same bytes as
the built-in method it replaced. A head of a key the sender does not own is the
peer's fault (``OwnerRuleError``: the connection closes, nothing is written).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from protocols.env import PolicyEnv
from protocols.errors import IntegrityError, OwnerRuleError
from protocols.policies._derivation import all_or_raise
from protocols.policy_rpc import PolicyContext, Rpc
from protocols.policy_schema import Bool, Head, List, Map
from protocols.records import HeadInfo

MAX_HEADS = 4096


def serve_announce(ctx: PolicyContext, peer: str, body: Mapping[str, Any]) -> dict[str, Any]:
    heads: list[HeadInfo] = body["heads"]
    for head in heads:  # validate all before writing any
        if ctx.roster.owners.get(head.key) != peer or head.owner != peer:
            raise OwnerRuleError(f"announce of {head.key!r} by {peer!r}, "
                                 f"which does not own it")
    for head in heads:
        ctx.store.set_synced_head(head)
    return {"ack": True}


ANNOUNCE = Rpc("announce", request=Map({"heads": List(Head(), max_len=MAX_HEADS, min_len=1)}),
               response=Map({"ack": Bool()}), handler=serve_announce, phase="fetch",
               doc="head envelopes of the sender's keys -> the receiver's synced view")


async def announce(env: PolicyEnv, peer: str, heads: Sequence[HeadInfo]) -> None:
    """One ``announce`` to ``peer``; returns on its ack."""
    answer = await env.call(peer, ANNOUNCE.name, {"heads": [h.to_wire() for h in heads]})
    if answer.get("ack") is not True:
        raise IntegrityError("announce: not acknowledged")


async def announce_to_all(env: PolicyEnv, heads: list[HeadInfo]) -> None:
    """One ``announce`` per other agent, concurrently; raises the first failure."""
    def sender(peer: str) -> Callable[[], Awaitable[None]]:
        return lambda: announce(env, peer, heads)

    await all_or_raise(env, [sender(p) for p in env.roster.peers_of(env.agent_id)])
