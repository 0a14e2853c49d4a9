"""The node's resource limits against a misbehaving roster member, and rate-limited logs.

Every limit is a setting with a default that no honest campaign reaches (the headroom
measured on the ``primary`` preset is in docs/architecture.md, "Limits"). The
controller may override any of them in ``configure`` (``limits: {name: value}``);
tests use that to make them small.

What each limit bounds (docs/architecture.md, "Threat model"):

- ``handshake_timeout_s``: accept -> handshake done. Before the handshake the decoder
  accepts only a frame of handshake size and reads no byte beyond it, so an
  unauthenticated connection holds at most one handshake frame.
- ``first_frame_timeout_s``: handshake done -> first authenticated frame. A replayed
  handshake message 1 completes a handshake that its sender cannot use; this closes
  it. An honest client sends its first request right after the handshake, but on a
  slow link it may arrive late, so a node raises both pre-request timeouts to its
  ``rpc_timeout_s`` (:meth:`Limits.for_rpc_timeout`).
- ``idle_timeout_s``: an authenticated connection that receives nothing for this long
  is closed (honest pooled connections are closed at every episode's reset).
- ``max_connections`` / ``max_connections_per_peer``: concurrent inbound connections.
  At the cap the oldest connection that has not yet sent an authenticated frame is
  evicted to make room; if every connection has, the new one is refused. Either way
  ``refused`` counts it.
- ``pre_auth_bytes_per_source``: bytes of partial frames held by the connections of one
  source address that have not yet sent an authenticated frame (a replayed hello
  followed by most of a 1 MiB frame holds 1 MiB). Past it the oldest such connection of
  that source is closed (its bytes are freed), so a flood holds at most this much and a
  new honest connection still gets in.
- ``answer_bytes_per_connection`` / ``answer_bytes_per_peer``: bytes of answers waiting
  on a peer that does not read them (encoded, not yet taken by the socket), on one
  connection and over all of one peer's connections. Past the first that connection is
  closed; past the second the peer's connection holding the most. Either way it is the
  peer's fault (``rejected``, logged) and the node keeps serving.
- ``held_bytes_per_node``: everything peers make the node hold at once, whatever the
  source, member or connection state: partial and complete received frames (before and
  after a connection proved itself) plus answers waiting on peers. The shares above
  (per source, per connection, per peer) live inside it; past it the connections
  holding the most are closed (the peer's fault, ``rejected``) until the node is back
  within it, so replayed hellos from many addresses, complete junk frames over many
  connections of one member, or many proven connections each holding a partial frame
  all stop at this one budget.
- ``install_records_per_peer`` / ``install_bytes_per_peer``: what one peer may install
  at this node in one episode (records, content bytes); past them the install is
  refused as the peer's protocol error and nothing of it is stored.
- ``log_lines_per_s``: peer-caused warnings per kind, beyond a burst of the same size.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


class LimitsError(ValueError):
    """A limits override names an unknown setting or a value out of range."""


@dataclass(frozen=True)
class Limits:
    handshake_timeout_s: float = 10.0
    first_frame_timeout_s: float = 10.0
    idle_timeout_s: float = 900.0
    max_connections: int = 512
    max_connections_per_peer: int = 128
    max_in_flight: int = 4096
    pre_auth_bytes_per_source: int = 16 * 1024 * 1024
    answer_bytes_per_connection: int = 64 * 1024 * 1024
    answer_bytes_per_peer: int = 128 * 1024 * 1024
    held_bytes_per_node: int = 128 * 1024 * 1024
    install_records_per_peer: int = 16384
    install_bytes_per_peer: int = 512 * 1024 * 1024
    log_lines_per_s: float = 5.0

    @classmethod
    def for_rpc_timeout(cls, rpc_timeout_s: float) -> Limits:
        """The defaults for a node whose calls may take ``rpc_timeout_s``: the two
        pre-request timeouts are at least that long, because on a slow link an honest
        client's handshake and first request wait behind the bytes already queued on
        its uplink (a 300 KiB artifact is 3 s at AT&T's mean rate), and the client
        gives up on the call only after ``rpc_timeout_s`` itself."""
        floor = float(rpc_timeout_s)
        defaults = cls()
        return replace(defaults,
                       handshake_timeout_s=max(defaults.handshake_timeout_s, floor),
                       first_frame_timeout_s=max(defaults.first_frame_timeout_s, floor))

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    def override(self, changes: Mapping[str, Any]) -> Limits:
        """These limits with ``changes`` applied; a bad name or value is a LimitsError."""
        known = {f.name: f.type for f in fields(self)}
        out: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise LimitsError(f"limits: unknown setting {name!r}; allowed: "
                                  f"{', '.join(known)}")
            integral = known[name] in ("int", int)
            ok = isinstance(value, int if integral else (int, float)) \
                and not isinstance(value, bool) and math.isfinite(value) and value > 0
            if not ok:
                kind = "a positive integer" if integral else "a positive number"
                raise LimitsError(f"limits.{name}: {value!r} is not allowed; allowed: {kind}")
            out[name] = int(value) if integral else float(value)
        return replace(self, **out)


class RateLimitedLog:
    """Warnings per kind through a token bucket: ``rate`` lines a second after a burst
    of ``rate`` lines; the next line that passes says how many were suppressed."""

    def __init__(self, logger: logging.Logger, *, rate_per_s: float = 5.0) -> None:
        self.logger = logger
        self.rate_per_s = rate_per_s
        self._buckets: dict[str, tuple[float, float, int]] = {}  # tokens, at, suppressed

    def warning(self, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``kind`` is over its rate; True if logged."""
        now = time.monotonic()
        burst = max(1.0, self.rate_per_s)
        tokens, at, suppressed = self._buckets.get(kind, (burst, now, 0))
        tokens = min(burst, tokens + (now - at) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[kind] = (tokens, now, suppressed + 1)
            return False
        self._buckets[kind] = (tokens - 1.0, now, 0)
        if suppressed:
            msg += f" ({suppressed} similar lines suppressed)"
        self.logger.warning(msg, *args)
        return True
