"""The node's logs for the controller, read after an episode (never on the action path).

- ``head_log``: ``[[key, seq, id, t_ns], ...]`` every head change of the keys this node
  owns (``nodes.store`` rule 3), from which the controller judges validity.
- ``install_log``: ``[[id, key, owner, seq, parents, rtype, author, installed_ns], ...]``
  every record this node stores with its install time, in install order: what it held
  and since when (the source of the episode's history, docs/history.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.control import ControlError
from nodes.store import SqliteStore


class LogOps:
    """Mixed into ``nodes.node.Node``: the two log ops over its store."""

    store: SqliteStore | None

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
