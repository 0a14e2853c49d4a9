"""The limit settings, the bytes held per connection and group, the rate-limited log (pure)."""

from __future__ import annotations

import logging
from typing import Literal

import pytest

from nodes.holdings import Holding
from nodes.limits import Limits, LimitsError, RateLimitedLog
from protocols.identity import Identity


def test_overrides_name_the_setting_and_what_is_allowed() -> None:
    limits = Limits().override({"max_connections": 8, "idle_timeout_s": 1})
    assert (limits.max_connections, limits.idle_timeout_s) == (8, 1.0)
    with pytest.raises(LimitsError, match="unknown setting 'max_sockets'"):
        Limits().override({"max_sockets": 1})
    with pytest.raises(LimitsError, match=r"limits.max_connections: 0 .* positive integer"):
        Limits().override({"max_connections": 0})
    with pytest.raises(LimitsError, match="positive number"):
        Limits().override({"idle_timeout_s": float("inf")})


def test_rate_limited_log_suppresses_a_flood_and_says_how_much(
        caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("t"), rate_per_s=5)
    with caplog.at_level(logging.WARNING):
        logged = sum(log.warning("accept", "accept failed %d", i) for i in range(1000))
    assert 5 <= logged <= 10  # the burst, plus what refilled while the loop ran
    assert log.warning("other", "another kind") is True  # kinds are separate


def test_episode_identities_differ_from_each_other_and_from_the_campaign_key() -> None:
    keys = {Identity.derive("a0", 7).public_key,
            Identity.derive("a0", 7, episode="x/1/e").public_key,
            Identity.derive("a0", 7, episode="x/2/e").public_key,
            Identity.derive("a0", 8, episode="x/1/e").public_key}
    assert len(keys) == 4
    assert Identity.derive("a0", 7, episode="e") == Identity.derive("a0", 7, episode="e")


def test_pre_request_timeouts_cover_the_calls_rpc_timeout() -> None:
    """On a slow link an honest first request may wait behind queued artifacts for
    longer than the 10 s default (the AT&T artifact tier did): a node allows as long as
    its callers do, and keeps the defaults where those are longer."""
    slow = Limits.for_rpc_timeout(60)
    assert (slow.handshake_timeout_s, slow.first_frame_timeout_s) == (60.0, 60.0)
    assert slow.idle_timeout_s == Limits().idle_timeout_s
    assert slow.max_connections == Limits().max_connections
    fast = Limits.for_rpc_timeout(2)
    assert (fast.handshake_timeout_s, fast.first_frame_timeout_s) == (10.0, 10.0)
    assert slow.override({"first_frame_timeout_s": 1}).first_frame_timeout_s == 1.0


# --- bytes held for peers (nodes/holdings.py) ------------------------------------------------
class _Conn:
    def __init__(self, group: str) -> None:
        self.group = group
        self.bytes = 0
        self.detached = False


def _holding(order: Literal["oldest", "largest"], *, per_connection: int | None = None,
             per_group: int = 100) -> Holding:
    return Holding("bytes", lambda c: c.group, per_connection=per_connection,
                   per_group=per_group, order=order, detached=lambda c: c.detached)


def test_past_a_group_cap_the_oldest_partial_frames_go_first() -> None:
    holding = _holding("oldest")
    conns = [_Conn("10.0.0.1") for _ in range(4)] + [_Conn("10.0.0.2")]
    for conn in conns:
        holding.set(conn, 30)
    assert holding.total("10.0.0.1") == 120
    assert holding.total("10.0.0.2") == 30
    newest = conns[3]
    assert holding.to_close(newest, conns) == [conns[0]]  # 120 - 30 <= 100
    holding.set(newest, 90)  # the one being served: the others first, it last
    assert holding.to_close(newest, conns) == [conns[0], conns[1], conns[2]]
    holding.set(newest, 101)
    assert holding.to_close(newest, conns)[-1] is newest
    assert holding.to_close(conns[4], conns) == []  # another source is not touched


def test_past_a_peer_cap_its_connection_holding_the_most_goes() -> None:
    holding = _holding("largest", per_connection=80)
    reader, hog, current = _Conn("a1"), _Conn("a1"), _Conn("a1")
    conns = [reader, hog, current]
    holding.set(reader, 5)
    holding.set(hog, 70)
    holding.set(current, 30)
    assert holding.to_close(current, conns) == [hog]
    holding.set(current, 81)  # past the connection's own cap
    assert holding.to_close(current, conns) == [current]


def test_a_detached_connection_stops_counting_and_releases_are_exact() -> None:
    holding = _holding("largest")
    a, b = _Conn("a1"), _Conn("a1")
    holding.set(a, 60)
    holding.set(b, 50)
    assert holding.to_close(b, [a, b]) == [a]
    holding.detach(a)
    a.detached = True
    assert holding.total("a1") == 50
    assert holding.to_close(b, [a, b]) == []
    holding.change(a, -20)  # its tasks let go later: only itself changes
    holding.release(a)
    assert holding.total("a1") == 50
    assert a.bytes == 0
    holding.release(b)
    assert holding.totals == {}


def test_byte_caps_are_limits_settings() -> None:
    limits = Limits().override({"pre_auth_bytes_per_source": 1 << 20,
                                "answer_bytes_per_connection": 1 << 21,
                                "answer_bytes_per_peer": 1 << 22})
    assert (limits.pre_auth_bytes_per_source, limits.answer_bytes_per_connection,
            limits.answer_bytes_per_peer) == (1 << 20, 1 << 21, 1 << 22)
    with pytest.raises(LimitsError, match="answer_bytes_per_peer: 0"):
        Limits().override({"answer_bytes_per_peer": 0})
