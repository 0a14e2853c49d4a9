"""A test-only plugin policy with its own RPC, durable state and a parameter.

Loaded into node processes with ``python -m nodes --plugin tests.nodes.rpc_probe_policy``.
``validate`` sends the owner of the first declared key two ``probe_count`` requests on
the same connection: the first asks the handler to raise (a policy fault: an error reply
on that request alone), the second adds ``step`` to a counter the owner keeps in its
durable policy state. It releases when the first failed with ``policy_fault`` and the
second answered; the block reason says what happened otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocols.api import (
    POLICY_FAULT,
    ActionOutcome,
    ActionRequest,
    Bool,
    Int,
    Map,
    Param,
    Policy,
    PolicyContext,
    PolicyEnv,
    RemoteCallError,
    Rpc,
    register,
)

COUNT = Rpc("probe_count", request=Map({"add": Int(0, 1000), "fail": Bool()}),
            response=Map({"total": Int(), "calls": Int()}), handler="serve_count",
            phase="query", doc="add to a durable counter at the receiver")
FAULT_MESSAGE = "probe_count: RuntimeError: asked to fail"


@register
class RpcProbe(Policy):
    name = "test_rpc_probe"
    parameters = (Param("step", "int", 1, lo=1, hi=100),)
    rpcs = (COUNT,)

    def serve_count(self, ctx: PolicyContext, peer: str, body: Mapping[str, Any]
                    ) -> dict[str, Any]:
        ctx.memory["calls"] = ctx.memory.get("calls", 0) + 1
        if body["fail"]:
            raise RuntimeError("asked to fail")
        total = ctx.state.get("total", 0) + body["add"]
        ctx.state.put("total", total)
        return {"total": total, "calls": ctx.memory["calls"]}

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        owner = env.roster.owner_of(request.declared[0])
        step = self.settings["step"]
        code = ""
        try:
            await env.call(owner, COUNT.name, {"add": step, "fail": True})
        except RemoteCallError as exc:
            code = exc.code
        answer = await env.call(owner, COUNT.name, {"add": step, "fail": False})
        env.memory["last_total"] = answer["total"]
        released = code == POLICY_FAULT
        return ActionOutcome(released, 0, request.roots if released else (), {},
                             block_reason="" if released else f"first call: {code!r}",
                             messages=2)
