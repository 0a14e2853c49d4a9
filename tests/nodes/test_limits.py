"""The limit settings and the rate-limited log (pure)."""

from __future__ import annotations

import logging

import pytest

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
