"""The wire settings of a node beside its other control ops.

- ``warm`` (no arguments): open a pooled connection to every other roster member now
  and prove each with one request (``nodes.client.RpcClient.warm_roster``); the
  controller sends it to every agent at setup for ``connection = "reuse_warm"``
  (``testbed/run/prepare.py``). A ``fresh`` node has no pool: an error reply.
- ``configure`` carries ``wire_encoding`` ("msgpack" default, or "json"): how this
  process sends records and head entries (``protocols.records`` rule 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.client import RpcClient
from nodes.control import ControlError, field
from protocols.records import WIRE_ENCODINGS, set_wire_encoding


class WireOps:
    """Mixed into ``nodes.node.Node``: the op and the setting above over its client."""

    client: RpcClient | None

    async def op_warm(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self.client is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        return {"opened": await self.client.warm_roster()}

    @staticmethod
    def configure_wire_encoding(args: Mapping[str, Any]) -> None:
        set_wire_encoding(field(args, "wire_encoding", str, allowed=WIRE_ENCODINGS,
                                default="msgpack"))
