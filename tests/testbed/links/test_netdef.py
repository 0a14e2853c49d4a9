"""Networks as data: [networks.NAME] tables, their one-line errors, the built-ins as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.links.linkspec import GilbertLoss, LinkSpec, NetworkProfile, ProfileError
from testbed.links.model import DirectionSpec, direction_spec
from testbed.links.netdef import network_to_data, parse_network
from testbed.links.profiles import TRACE_PROFILES, get_profile, network_template, profile_names
from testbed.links.traces import load_named

# --- the built-in networks as data give the link specs the code gave before ---------------

# The registrations of profiles.py before the networks became data, verbatim (the first
# networks of the registry; those added since follow them).
OLD_LINKS: dict[str, LinkSpec | None] = {  # frozen record
    "loopback": None,
    "fixed": LinkSpec(),
    "att": LinkSpec(up_trace="ATT-LTE-driving.up", down_trace="ATT-LTE-driving.down"),
    "att2016": LinkSpec(up_trace="ATT-LTE-driving-2016.up",
                        down_trace="ATT-LTE-driving-2016.down"),
    "tmobile": LinkSpec(up_trace="TMobile-LTE-short.up", down_trace="TMobile-LTE-short.down"),
    "verizon": LinkSpec(up_trace="Verizon-LTE-short.up", down_trace="Verizon-LTE-short.down"),
}


def test_builtin_networks_are_registered_in_the_old_order() -> None:
    assert profile_names()[:6] == tuple(OLD_LINKS)
    for name, old in OLD_LINKS.items():  # networks added later may follow
        if old is not None and old.up_trace is not None:
            assert TRACE_PROFILES[name] == (old.up_trace, old.down_trace)


@pytest.mark.parametrize("name", list(OLD_LINKS))
@pytest.mark.parametrize("delay_ms", [None, 7.5])
def test_builtin_networks_as_data_give_the_same_link_specs(name: str,
                                                           delay_ms: float | None) -> None:
    profile = get_profile(name, delay_ms=delay_ms if name != "loopback" else None)
    old = OLD_LINKS[name]
    if old is not None and delay_ms is not None:
        old = LinkSpec(up_trace=old.up_trace, down_trace=old.down_trace, delay_ms=delay_ms)
    assert profile.link == old
    assert profile.hosts == ()
    assert profile.congestion_control == "cubic"
    if old is None:
        return
    for side in ("up", "down"):
        trace_name = old.up_trace if side == "up" else old.down_trace
        stamps = period = None
        if trace_name is not None:
            trace = load_named(trace_name)
            stamps, period = tuple(trace.stamps_ms.tolist()), int(trace.period_ms)
        # exactly the DirectionSpec the old direction_spec built (old fields only)
        expected = DirectionSpec(delay_ms=old.delay_ms, loss_pct=0.0, queue_packets=1000,
                                 queue_bytes=None, rate_kbit=None, trace_name=trace_name,
                                 stamps_ms=stamps, period_ms=period, offset_ms=5000.0)
        got = direction_spec(profile.link, side, offset_ms=5000.0)
        assert got == expected
        assert got.stamps_ms == expected.stamps_ms  # compare=True but repr=False


def test_fixed_with_a_rate_gives_the_old_spec() -> None:
    link = get_profile("fixed", rate_kbit=12_000, queue_bytes=64_000).link
    assert link == LinkSpec(rate_kbit=12_000, queue_bytes=64_000)
    assert direction_spec(link, "down") == DirectionSpec(
        delay_ms=20.0, loss_pct=0.0, queue_packets=1000, queue_bytes=64_000,
        rate_kbit=12_000, trace_name=None, stamps_ms=None, period_ms=None, offset_ms=0.0)


# --- parsing ---------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "my.up").write_text("1\n")  # 12 Mbit/s
    (tmp_path / "my.down").write_text("1\n1\n")  # 24 Mbit/s
    (tmp_path / "delay.txt").write_text("# ms delay\n0 10\n1500 40\n")
    (tmp_path / "bad.up").write_text("5\n3\n")
    (tmp_path / "bad-delay.txt").write_text("0 10\n10 x\n")
    return tmp_path


def parse(table: dict[str, Any], base: Path | None = None) -> NetworkProfile:
    return parse_network("myfi", table, base_dir=base, known=network_template)


def test_a_full_definition(files: Path) -> None:
    profile = parse({
        "description": "mine", "up_trace": "my.up", "down_trace": "my.down",
        "delay_ms": 12, "loss": {"model": "gilbert", "p": 0.01, "r": 0.25,
                                 "loss_bad_pct": 80},
        "queue": {"kind": "codel", "target_ms": 4, "interval_ms": 80, "packets": 300},
        "trace_offset_s": 0.5,
        "hosts": {"central": {"rate_kbit": 100_000, "delay_ms": 1},
                  "1": {"network": "tmobile"},
                  "a2": {"network": "myfi", "delay_trace": "delay.txt"}},
    }, files)
    link = profile.link
    assert link is not None
    assert link.up_trace == str(files / "my.up")
    assert link.down_trace == str(files / "my.down")
    assert (link.delay_ms, link.queue_kind, link.codel_target_ms, link.codel_interval_ms,
            link.queue_packets) == (12.0, "codel", 4.0, 80.0, 300)
    assert link.gilbert == GilbertLoss(p=0.01, r=0.25, loss_good_pct=0.0, loss_bad_pct=80.0)
    hosts = dict(profile.hosts)
    assert hosts["central"] == LinkSpec(rate_kbit=100_000, delay_ms=1)  # a link of its own
    assert hosts["1"] == get_profile("tmobile").link
    a2 = hosts["a2"]  # this network's link, the delay from the delay trace
    assert (a2.up_trace, a2.gilbert, a2.delay_trace, a2.delay_ms) == (
        link.up_trace, link.gilbert, str(files / "delay.txt"), 10.0)
    assert profile.link_of("central", 3) == hosts["central"]
    assert profile.link_of("a1", 1) == hosts["1"]
    assert profile.link_of("a2", 2) == a2
    assert profile.link_of("a0", 0) == link


def test_a_host_giving_a_capacity_or_delay_replaces_the_group(files: Path) -> None:
    profile = parse({"up_trace": "my.up", "down_trace": "my.down", "delay_trace": "delay.txt",
                     "hosts": {"0": {"network": "myfi", "up_rate_kbit": 500,
                                     "down_rate_kbit": 900, "delay_ms": 3}}}, files)
    host = dict(profile.hosts)["0"]
    assert (host.up_trace, host.rate_of("up"), host.rate_of("down")) == (None, 500, 900)
    assert (host.delay_trace, host.delay_ms) == (None, 3.0)


def test_a_shipped_trace_by_name_and_the_definition_round_trips(files: Path) -> None:
    profile = parse({"up_trace": "ATT-LTE-driving.up", "down_trace": "my.down",
                     "loss": {"model": "iid", "pct": 1.5},
                     "queue": {"packets": 50, "bytes": 60_000},
                     "hosts": {"central": {"rate_kbit": 1000}}}, files)
    assert profile.link is not None
    assert profile.link.up_trace == "ATT-LTE-driving.up"
    again = parse_network("myfi", network_to_data(profile), known=network_template)
    assert again == profile


def test_an_unshaped_network() -> None:
    profile = parse({"unshaped": True, "description": "no link"})
    assert profile.link is None
    assert profile.base_rtt_ms == 0.0
    assert parse(network_to_data(profile)) == profile


def test_a_network_starting_from_a_builtin_replaces_only_the_groups_it_gives() -> None:
    att = get_profile("att")
    assert att.link is not None
    profile = parse({"network": "att", "delay_ms": 35,
                     "hosts": {"central": {"rate_kbit": 100_000, "delay_ms": 1}}})
    link = profile.link
    assert link is not None
    assert (link.up_trace, link.down_trace) == (att.link.up_trace, att.link.down_trace)
    assert link == att.link.with_overrides(delay_ms=35.0)
    assert profile.congestion_control == att.congestion_control
    assert dict(profile.hosts) == {"central": LinkSpec(rate_kbit=100_000, delay_ms=1)}
    # the same network written out in full parses to the same profile
    assert parse(network_to_data(profile)) == profile


def test_a_network_starting_from_another_keeps_its_hosts_unless_it_names_them() -> None:
    parent = parse_network("wired_core", {
        "rate_kbit": 20_000, "delay_ms": 10, "congestion_control": "reno",
        "hosts": {"central": {"rate_kbit": 100_000, "delay_ms": 1},
                  "0": {"network": "tmobile"}, "1": {"congestion_control": "cubic"}}},
        known=network_template)
    known = {"wired_core": parent}
    child = parse_network("slow_agent", {
        "network": "wired_core", "up_rate_kbit": 500, "down_rate_kbit": 2000,
        "hosts": {"0": {"network": "slow_agent", "delay_ms": 40}}},
        known=lambda name: known.get(name) or network_template(name))
    assert child.link is not None
    assert parent.link is not None
    assert (child.link.rate_of("up"), child.link.rate_of("down"), child.link.delay_ms) == (
        500, 2000, 10.0)
    assert child.congestion_control == "reno"
    hosts = dict(child.hosts)
    assert hosts["central"] == dict(parent.hosts)["central"]
    assert hosts["0"] == child.link.with_overrides(delay_ms=40.0)
    assert child.host_congestion_control == (("1", "cubic"),)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"rate": 1}, "networks.myfi: unknown field 'rate'; allowed: description, unshaped,"),
    ({"loss": {"model": "gilbert", "p": 1.5, "r": 0.1}},
     "networks.myfi.loss.p: 1.5 is not allowed; allowed: a number > 0 and <= 1"),
    ({"loss": {"model": "gilbert", "p": 0.1}}, "networks.myfi.loss.r: missing;"),
    ({"loss": {"model": "gilbert", "p": 0.1, "r": 0.2, "loss_bad_pct": 120}},
     "networks.myfi.loss.loss_bad_pct: 120 is not allowed; allowed: a number >= 0 and <= 100"),
    ({"loss": {"model": "burst"}},
     "networks.myfi.loss.model: 'burst' is not allowed; allowed: none, iid, gilbert"),
    ({"loss": {"model": "iid", "pct": 100}},
     "networks.myfi.loss.pct: 100 is not allowed; allowed: a number >= 0 and < 100"),
    ({"loss": {"model": "iid", "pct": 1, "p": 0.1}},
     "networks.myfi.loss: unknown field 'p'; allowed: model, pct"),
    ({"loss": 5}, "networks.myfi.loss: expected a table, e.g."),
    ({"rate_kbit": 100, "queue": {"packets": 0}},
     "networks.myfi.queue.packets: 0 is not allowed; allowed: an integer >= 1"),
    ({"rate_kbit": 100, "queue": {"bytes": 1000}},
     "networks.myfi.queue.bytes: 1000 is not allowed; allowed: an integer >= 1500 (bytes the "
     "queue holds; one full packet must fit)"),
    ({"rate_kbit": 100, "queue": {"kind": "red"}},
     "networks.myfi.queue.kind: 'red' is not allowed; allowed: droptail, drophead, codel, pie, fq_codel"),
    ({"rate_kbit": 100, "queue": {"kind": "codel", "target_ms": 20, "interval_ms": 10}},
     "networks.myfi.queue.interval_ms: 10 is not allowed; allowed: a number >= 20"),
    ({"rate_kbit": 100, "queue": {"kind": "droptail", "target_ms": 5}},
     "networks.myfi.queue: unknown field 'target_ms'; allowed: kind, packets, bytes"),
    ({"queue": {"kind": "codel"}}, "networks.myfi.queue.kind: codel needs a bottleneck"),
    ({"up_trace": "my.up"}, "networks.myfi.down_trace: missing; a trace-driven link needs both"),
    ({"up_trace": "my.up", "down_trace": "my.down", "rate_kbit": 10},
     "networks.myfi.rate_kbit: a trace-driven link takes its rate from up_trace"),
    ({"rate_kbit": 10, "up_rate_kbit": 5}, "networks.myfi.rate_kbit: give rate_kbit (both "),
    ({"rate_kbit": 0}, "networks.myfi.rate_kbit: 0 is not allowed; allowed: a number > 0"),
    ({"up_rate_kbit": "fast"}, "networks.myfi.up_rate_kbit: 'fast' is not allowed;"),
    ({"delay_ms": -1}, "networks.myfi.delay_ms: -1 is not allowed; allowed: a number >= 0 "
                       "and <= 10000"),
    ({"delay_ms": 5, "delay_trace": "delay.txt"},
     "networks.myfi.delay_ms: a link with delay_trace takes its delay from the trace"),
    ({"delay_trace": "nope.txt"}, "networks.myfi.delay_trace: 'nope.txt' is not a file"),
    ({"delay_trace": "bad-delay.txt"}, "networks.myfi.delay_trace: "),
    ({"up_trace": "nope.up", "down_trace": "my.down"},
     "networks.myfi.up_trace: 'nope.up' is neither a file (no file "),
    ({"up_trace": "bad.up", "down_trace": "my.down"},
     "networks.myfi.up_trace: "),
    ({"trace_offset_s": -1}, "networks.myfi.trace_offset_s: -1 is not allowed"),
    ({"trace_wrap": "yes"}, "networks.myfi.trace_wrap: 'yes' is not allowed; allowed: true"),
    ({"hosts": {"a-b": {}}}, "networks.myfi.hosts.a-b: not a host; allowed: an agent index"),
    ({"hosts": {"1": {"speed": 1}}}, "networks.myfi.hosts.1: unknown field 'speed'; allowed: "
                                     "network,"),
    ({"hosts": {"1": {"network": "mars"}}},
     "networks.myfi.hosts.1.network: 'mars' is not allowed; allowed: a built-in network"),
    ({"hosts": {"1": {"network": "loopback"}}},
     "networks.myfi.hosts.1.network: 'loopback' has no link (unshaped)"),
    ({"hosts": {"central": {"loss": {"model": "iid", "pct": -2}}}},
     "networks.myfi.hosts.central.loss.pct: -2 is not allowed"),
    ({"unshaped": True, "delay_ms": 5}, "networks.myfi.delay_ms: an unshaped network"),
    ({"network": "myfi"}, "networks.myfi.network: 'myfi' is not allowed; allowed: a built-in "
                          "network or one defined before this one"),
    ({"network": "mars"}, "networks.myfi.network: 'mars' is not allowed;"),
    ({"network": "loopback"}, "networks.myfi.network: 'loopback' has no link (unshaped)"),
    ({"network": "att", "rate_kbit": 0}, "networks.myfi.rate_kbit: 0 is not allowed"),
    ({"congestion_control": "Cubic!"}, "networks.myfi.congestion_control: 'Cubic!' is not a"),
    ({"description": 3}, "networks.myfi.description: 3 is not allowed; allowed: a string"),
]


@pytest.mark.parametrize(("table", "message"), BAD)
def test_each_bad_field_is_one_line_naming_it(files: Path, table: dict[str, Any],
                                              message: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse(table, files)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_bad_trace_content_names_the_file_and_line(files: Path) -> None:
    with pytest.raises(ProfileError, match=r"bad\.up:2: stamp 3 is smaller than the previous 5"):
        parse({"up_trace": "bad.up", "down_trace": "my.down"}, files)
    with pytest.raises(ProfileError, match=r"bad-delay\.txt:2: expected '<ms> <delay_ms>'"):
        parse({"delay_trace": "bad-delay.txt"}, files)


def test_bad_network_name() -> None:
    with pytest.raises(ProfileError, match=r"^networks\.My-Net: the name is not allowed"):
        parse_network("My-Net", {})
