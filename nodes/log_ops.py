"""The node's logs for the controller, read after an episode (never on the action path).

- ``head_log``: ``[[key, seq, id, t_ns], ...]`` every head change of the keys this node
  owns (``nodes.store`` rule 3), from which the controller judges validity.
- ``install_log``: ``[[id, key, owner, seq, parents, rtype, author, installed_ns], ...]``
  every record this node stores with its install time, in install order: what it held
  and since when (the source of the episode's history, docs/history.md).
- ``rpc_log``: ``{"calls": [[peer, method, sent_ns, returned_ns], ...], "served":
  [[caller, method, answered_ns], ...]}`` every remote call this node made and every
  data-plane request it answered this episode (the history's optional ``rpc`` events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.control import ControlError
from nodes.node_env import NodeEnv
from nodes.store import SqliteStore


class LogOps:
    """Mixed into ``nodes.node.Node``: the log ops over its store and its RPC records."""

    store: SqliteStore | None
    env: NodeEnv | None
    served_log: list[tuple[str, str, int]]

    def _store(self) -> SqliteStore:
        if self.store is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        return self.store

    async def op_head_log(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"log": [list(entry) for entry in self._store().head_log()]}

    async def op_install_log(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"log": [[rid, key, owner, seq, list(parents), rtype, author, t_ns]
                        for rid, key, owner, seq, parents, rtype, author, t_ns
                        in self._store().install_log()]}

    async def op_rpc_log(self, args: Mapping[str, Any]) -> dict[str, Any]:
        calls = [] if self.env is None else [list(c) for c in self.env.rpc_log]
        return {"calls": calls, "served": [list(s) for s in self.served_log]}
