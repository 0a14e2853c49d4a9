"""Bytes a node holds for its peers, per connection and per group, against two caps.

Rules of this module (pure: no I/O; ``nodes/server.py`` keeps the holdings):

1. A :class:`Holding` is one kind of bytes held for peers, kept in one attribute of
   each connection and summed per group of connections: ``pre_auth`` (the partial
   frame of a connection that has not yet sent an authenticated frame, grouped by
   source address) and ``answers`` (answers encoded for a peer and not yet taken by
   its socket, grouped by the authenticated peer).
2. Bytes are counted when they are held and released when they are let go (a frame
   completed, an answer taken by the kernel, the connection closed); a connection's
   release is exact, so a group's total is 0 once its connections are gone.
3. Past a cap, connections are closed, never the node: :meth:`Holding.to_close` names
   which, the connection that went past its own cap, else connections of the group in
   the holding's order (``oldest`` first: an honest connection completes its first
   frame within a round trip, so the oldest partial frames are a flood's; ``largest``
   first: the peer's connection holding the most is the one that does not read; for
   ``oldest`` the connection being served comes last).
4. A connection being closed is *detached* first (:meth:`Holding.detach`): its bytes
   leave its group's total at once and its later releases touch only itself, so the
   caps bound what live connections hold (a closed connection's tasks let go of theirs
   at their next checkpoint).
5. :meth:`Holding.change` returns what the connection and its group now hold, for the
   node's high-water marks (``counters``: the honest peaks the caps are compared with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

Order = Literal["oldest", "largest"]


class Holding:
    """One kind of bytes held (rule 1)."""

    def __init__(self, attr: str, group_of: Callable[[Any], str | None], *,
                 per_connection: int | None, per_group: int, order: Order,
                 detached: Callable[[Any], bool]) -> None:
        self.attr = attr
        self.group_of = group_of
        self.detached = detached
        self.per_connection = per_connection
        self.per_group = per_group
        self.order = order
        self.totals: dict[str, int] = {}

    def held(self, conn: Any) -> int:
        value: int = getattr(conn, self.attr)
        return value

    def change(self, conn: Any, delta: int) -> tuple[int, int]:
        """``conn`` holds ``delta`` bytes more (or fewer); returns what it and its
        group now hold."""
        held = self.held(conn) + delta
        setattr(conn, self.attr, held)
        group = self.group_of(conn) or "?"
        if self.detached(conn):
            return held, self.totals.get(group, 0)
        total = self.totals.get(group, 0) + delta
        if total:
            self.totals[group] = total
        else:
            self.totals.pop(group, None)
        return held, total

    def set(self, conn: Any, held: int) -> tuple[int, int]:
        return self.change(conn, held - self.held(conn))

    def release(self, conn: Any) -> None:
        self.change(conn, -self.held(conn))

    def detach(self, conn: Any) -> None:
        """``conn`` is being closed (rule 4): call before ``detached(conn)`` is true."""
        if not self.detached(conn):
            group = self.group_of(conn) or "?"
            total = self.totals.get(group, 0) - self.held(conn)
            if total:
                self.totals[group] = total
            else:
                self.totals.pop(group, None)

    def total(self, group: str | None) -> int:
        return self.totals.get(group or "?", 0)

    def to_close(self, conn: Any, conns: Iterable[Any]) -> list[Any]:
        """The connections to close so that ``conn`` and its group are within the caps
        (rule 3); ``conns`` in order of age."""
        if self.per_connection is not None and self.held(conn) > self.per_connection:
            return [conn]
        group = self.group_of(conn) or "?"
        if self.totals.get(group, 0) <= self.per_group:
            return []
        mine = [c for c in conns if (self.group_of(c) or "?") == group and self.held(c) > 0
                and not self.detached(c)]
        total = sum(self.held(c) for c in mine)
        if self.order == "largest":
            order = sorted(mine, key=self.held, reverse=True)
        else:
            order = [*(c for c in mine if c is not conn), conn]
        chosen = []
        for victim in order:
            if total <= self.per_group:
                break
            chosen.append(victim)
            total -= self.held(victim)
        return chosen
