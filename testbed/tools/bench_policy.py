"""The plugin policy of ``testbed bench rpc``: ``bench_heads``, a policy-defined method
with the body and answer of the built-in ``heads`` (owner heads of the keys asked), so
the benchmark can compare the two in one run. Nodes load it as a plugin
(``--plugin testbed.tools.bench_policy``); its validation is local replica's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocols.api import Head, List, Map, PolicyContext, RemoteCallError, Rpc, Str, register
from protocols.policies.local_replica import LocalReplica

NAME = "bench_policy_heads"
MODULE = __name__


def serve_heads(ctx: PolicyContext, peer: str, body: Mapping[str, Any]) -> dict[str, Any]:
    out = []
    for key in body["keys"]:
        if ctx.roster.owners.get(key) != ctx.agent_id:
            raise RemoteCallError("not_owner", f"{ctx.agent_id} does not own {key!r}")
        head = ctx.store.head(key)
        if head is None:
            raise RemoteCallError("no_head", f"{key!r} has no head yet")
        out.append(head)
    return {"heads": out}


HEADS = Rpc("bench_heads", request=Map({"keys": List(Str(max_len=200, min_len=1),
                                                     max_len=4096, min_len=1)}),
            response=Map({"heads": List(Head(), max_len=4096)}), handler=serve_heads,
            phase="query", doc="the built-in heads, as a policy-defined method")


@register
class BenchPolicyHeads(LocalReplica):
    name = NAME
    display_name = "bench: heads as a policy method"
    rpcs = (HEADS,)
