"""Named network profiles and the one-line errors for bad overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import UserError
from testbed.links.profiles import (
    TRACE_PROFILES,
    LinkSpec,
    ProfileError,
    builtin_names,
    get_profile,
    profile_names,
)
from testbed.links.traces import load_named
from tests.names import networks


def test_the_builtin_networks_come_first_in_file_order() -> None:
    assert profile_names()[:len(builtin_names())] == builtin_names()
    assert builtin_names()[:3] == ("loopback", "fixed", "att")


def test_loopback_has_no_link() -> None:
    profile = get_profile("loopback")
    assert profile.link is None
    assert profile.base_rtt_ms == 0.0
    assert profile.congestion_control == "cubic"


def test_fixed_defaults_give_an_80_ms_round_trip() -> None:
    profile = get_profile("fixed")
    assert profile.link is not None
    assert profile.link.delay_ms == 20.0
    assert profile.link.rate_kbit is None
    assert not profile.link.trace_driven
    assert profile.base_rtt_ms == 80.0


def test_fixed_overrides() -> None:
    profile = get_profile(
        "fixed", delay_ms=5, rate_kbit=12_000, loss_pct=1.5, queue_packets=64, queue_bytes=96_000
    )
    assert profile.link == LinkSpec(
        rate_kbit=12_000, delay_ms=5, loss_pct=1.5, queue_packets=64, queue_bytes=96_000
    )
    assert profile.base_rtt_ms == 20.0


@pytest.mark.parametrize("name", sorted(TRACE_PROFILES))
def test_trace_profiles_name_loadable_traces(name: str) -> None:
    profile = get_profile(name, delay_ms=10)
    link = profile.link
    assert link is not None
    assert link.trace_driven
    assert link.rate_kbit is None
    assert link.delay_ms == 10
    assert link.up_trace is not None
    assert link.down_trace is not None
    assert load_named(link.up_trace).direction == "up"
    assert load_named(link.down_trace).direction == "down"


def test_profiles_are_frozen() -> None:
    profile = get_profile("att")
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "x"  # type: ignore[misc]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"name": "lte"}, rf"^network: unknown profile 'lte'; allowed: {', '.join(profile_names())}$"),
    ({"name": "att", "rate_kbit": 1000},
     rf"^rate_kbit: .*allowed only with: {', '.join(networks(shaped=True, traced=False))}$"),
    ({"name": "loopback", "delay_ms": 5}, r"^delay_ms: the loopback profile has no link"),
    ({"name": "fixed", "delay_ms": -1}, r"^delay_ms: -1 is not allowed; use a number >= 0 and <= 10000$"),
    ({"name": "fixed", "delay_ms": float("inf")}, r"^delay_ms: inf is not allowed"),
    ({"name": "fixed", "rate_kbit": 0}, r"^rate_kbit: 0 is not allowed; use a number > 0$"),
    ({"name": "fixed", "loss_pct": 100}, r"^loss_pct: 100 is not allowed; use a number >= 0 and < 100$"),
    ({"name": "att", "loss_pct": -0.5}, r"^loss_pct: -0.5 is not allowed"),
    ({"name": "fixed", "queue_packets": 0}, r"^queue_packets: 0 is not allowed; use an integer >= 1$"),
    ({"name": "fixed", "queue_packets": 2.5}, r"^queue_packets: 2.5 is not allowed"),
    ({"name": "fixed", "queue_bytes": 1000}, r"^queue_bytes: 1000 is not allowed; use None or an integer >= 1500$"),
    ({"name": "fixed", "congestion_control": "Cubic!"}, r"^congestion_control: 'Cubic!' is not a kernel"),
]


@pytest.mark.parametrize(("kwargs", "pattern"), BAD)
def test_bad_input_names_the_field_in_one_line(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ProfileError, match=pattern) as info:
        get_profile(**kwargs)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, UserError)  # the user's fault: one line, exit 2


def test_linkspec_needs_both_traces_or_neither() -> None:
    with pytest.raises(ProfileError, match=r"^up_trace/down_trace: set both"):
        LinkSpec(up_trace="ATT-LTE-driving.up")
    with pytest.raises(ProfileError, match=r"^rate_kbit: a trace-driven link"):
        LinkSpec(up_trace="a.up", down_trace="a.down", rate_kbit=100)


def test_missing_trace_folder_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_TRACE_DIR", str(tmp_path))
    with pytest.raises(ProfileError, match=r"needs trace 'TMobile-LTE-short\.up'"):
        get_profile("tmobile")
    assert get_profile("fixed").link is not None  # fixed needs no trace
