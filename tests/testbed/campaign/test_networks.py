"""A campaign's own networks: parsing, checks against the grid, config and provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.campaign.model import CampaignError
from testbed.campaign.networks import changed_files, network_provenance
from testbed.campaign.parse import load_campaign, parse_campaign, recorded_campaign
from testbed.links.profiles import get_profile, profile_names

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "mixed-team" / "campaign.toml"

CAMPAIGN = """
name = "own"
seed = 3
templates = 1
[options]
link_log = true
[networks.myfi]
up_trace = "t/my.up"
down_trace = "t/my.down"
delay_ms = 5
loss = { model = "iid", pct = 1 }
queue = { kind = "droptail", packets = 64 }
[networks.myfi.hosts.central]
rate_kbit = 50000
delay_ms = 1
[grid]
policy = ["planfence", "centralized_lineage"]
network = ["myfi", "loopback"]
agents = [3]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "my.up").write_text("1\n2\n3\n1000\n")
    (tmp_path / "t" / "my.down").write_text("1\n")
    (tmp_path / "c.toml").write_text(CAMPAIGN)
    return tmp_path


def test_a_campaign_defines_and_names_its_networks(folder: Path) -> None:
    campaign = load_campaign(folder / "c.toml")
    assert {c.network for c in campaign.cells()} == {"myfi", "loopback"}
    profile = campaign.network_profile("myfi")
    assert profile.link is not None
    assert profile.link.up_trace == str(folder / "t" / "my.up")  # relative to the file
    assert profile.link.loss_pct == 1.0
    assert profile.link.queue_packets == 64
    assert dict(profile.hosts)["central"].rate_kbit == 50_000
    assert campaign.network_profile("loopback").link is None
    assert campaign.options.link_log


def test_config_round_trips_and_old_configs_stay_equal(folder: Path) -> None:
    campaign = load_campaign(folder / "c.toml")
    config = campaign.config()
    assert config["options"]["link_log"] is True
    assert set(config["networks"]) == {"myfi"}
    again = recorded_campaign(config)
    assert again.cells() == campaign.cells()
    assert again.networks == campaign.networks
    # a campaign without networks or link logs has the config it had before them
    plain = parse_campaign({"name": "p", "seed": 1, "templates": 1,
                            "grid": {"policy": ["planfence"], "network": ["att"]}})
    assert "networks" not in plain.config()
    assert "link_log" not in plain.config()["options"]


def test_provenance_hashes_every_replayed_file(folder: Path) -> None:
    campaign = load_campaign(folder / "c.toml")
    recorded = network_provenance(campaign)
    assert recorded["loopback"]["files"] == []
    files = {f["field"]: f for f in recorded["myfi"]["files"]}
    assert set(files) == {"networks.myfi.up_trace", "networks.myfi.down_trace"}
    assert files["networks.myfi.down_trace"]["size"] == 2
    assert files["networks.myfi.down_trace"]["sha256"] == (
        "4355a46b19d348dc2f57c046f8ef63d4538ebb936000f3c9ee954a27460dd865")
    assert recorded["myfi"]["definition"]["queue"] == {"kind": "droptail", "packets": 64}
    assert changed_files(recorded) is None
    (folder / "t" / "my.down").write_text("1\n1\n")
    reason = changed_files(recorded)
    assert reason is not None
    assert reason.startswith(
        f"networks.myfi.down_trace: {folder / 't' / 'my.down'} changed since the run started")
    (folder / "t" / "my.down").unlink()
    assert "is gone since the run started" in str(changed_files(recorded))


def test_builtin_provenance_names_the_shipped_files() -> None:
    campaign = parse_campaign({"name": "p", "seed": 1, "templates": 1,
                               "grid": {"policy": ["planfence"], "network": ["att"]}})
    files = network_provenance(campaign)["att"]["files"]
    assert [Path(f["path"]).name for f in files] == ["ATT-LTE-driving.up",
                                                     "ATT-LTE-driving.down"]
    assert network_provenance(campaign)["att"]["defined_in"] == "built-in"


def _errors(folder: Path, text: str) -> str:
    (folder / "c.toml").write_text(text)
    with pytest.raises(CampaignError) as info:
        load_campaign(folder / "c.toml")
    assert "\n" not in str(info.value)
    return str(info.value)


BAD: list[tuple[str, str, str]] = [
    ("[networks.myfi]", "[networks.att]",
     "networks.att: 'att' is a registered network; choose another name"),
    ('network = ["myfi", "loopback"]', 'network = ["mine"]',
     f"grid.network: 'mine' is not allowed; allowed: {', '.join(profile_names())}, myfi"),
    ("[networks.myfi.hosts.central]", "[networks.myfi.hosts.3]",
     "networks.myfi.hosts.3: no such agent in cells with agents = 3; allowed: 0..2, a0..a2 "
     "or central"),
    ("[networks.myfi.hosts.central]", "[networks.myfi.hosts.a7]",
     "networks.myfi.hosts.a7: no such agent in cells with agents = 3;"),
    ("[networks.myfi.hosts.central]", "[networks.myfi.hosts.bob]",
     "networks.myfi.hosts.bob: 'bob' is not a host name; allowed: an agent index (0..2), "
     "an agent name (a0..a2) or central"),
    ("[networks.myfi.hosts.central]\nrate_kbit = 50000\ndelay_ms = 1",
     "[networks.myfi.hosts.1]\nrate_kbit = 1\n[networks.myfi.hosts.a1]\nrate_kbit = 2",
     "networks.myfi.hosts.a1: agent 1 is already given as hosts.1; name each host once"),
    ("link_log = true", "link_log = 1", "options.link_log: 1 is not allowed; allowed: true, "
                                        "false"),
    ('delay_ms = 5', 'delay_ms = 5\ntrace_offset_s = 0.5',
     "grid.trace_offset_s: 0 + networks.myfi.trace_offset_s 0.5 s is past the end of trace "
     "my.down (0.001 s) of network myfi; allowed: offsets < 0.001 s, or trace_wrap = true"),
    ('up_trace = "t/my.up"', 'up_trace = "t/gone.up"',
     "networks.myfi.up_trace: 't/gone.up' is neither a file"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD)
def test_bad_networks_fail_in_one_line_before_anything_runs(folder: Path, old: str, new: str,
                                                            message: str) -> None:
    assert old in CAMPAIGN
    text = _errors(folder, CAMPAIGN.replace(old, new).replace('"myfi", "loopback"', '"att"')
                   if old == "[networks.myfi]" else CAMPAIGN.replace(old, new))
    assert text.startswith(message), text


def test_offsets_past_a_builtin_trace_end_are_refused_unless_wrapped(folder: Path) -> None:
    text = ('name = "o"\nseed = 1\ntemplates = 1\n[grid]\npolicy = ["planfence"]\n'
            'network = ["tmobile"]\ntrace_offset_s = [150]\n')
    assert _errors(folder, text).startswith(
        "grid.trace_offset_s: 150 s is past the end of trace TMobile-LTE-short.up (140 s) of "
        "network tmobile; allowed: offsets < 140 s, or trace_wrap = true in a network")
    wrapped = text.replace('network = ["tmobile"]', 'network = ["tmo"]') + (
        '[networks.tmo]\nup_trace = "TMobile-LTE-short.up"\n'
        'down_trace = "TMobile-LTE-short.down"\ntrace_wrap = true\n')
    (folder / "c.toml").write_text(wrapped)
    assert load_campaign(folder / "c.toml").cells()[0].trace_offset_s == 150.0


def test_missing_builtin_traces_are_refused_at_parse(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_TRACE_DIR", str(tmp_path))
    with pytest.raises(CampaignError, match=r"^grid\.network: profile 'att' needs trace"):
        parse_campaign({"name": "p", "seed": 1, "templates": 1,
                        "grid": {"policy": ["planfence"], "network": ["att"]}})


def test_the_example_campaign_loads() -> None:
    campaign = load_campaign(EXAMPLE)
    profile = campaign.network_profile("field")
    hosts = dict(profile.hosts)
    assert hosts["1"].up_trace == get_profile("tmobile").link.up_trace  # type: ignore[union-attr]
    assert hosts["a2"].delay_trace is not None
    assert hosts["central"].rate_kbit == 100_000
    assert profile.link is not None
    assert profile.link.gilbert is not None
    assert len(campaign.episodes()) == 4


def test_options_delay_applies_to_builtin_networks_only(folder: Path) -> None:
    data: dict[str, Any] = {"name": "d", "seed": 1, "templates": 1,
                            "options": {"delay_ms": 7},
                            "grid": {"policy": ["planfence"], "network": ["fixed"]}}
    assert parse_campaign(data).network_profile("fixed").base_rtt_ms == 28.0
    own = load_campaign(folder / "c.toml")
    assert own.network_profile("myfi").base_rtt_ms == 20.0


def test_an_explicit_netem_backend_that_cannot_run_a_network_is_refused_at_parse(
        folder: Path) -> None:
    text = CAMPAIGN.replace("link_log = true", 'link_log = true\nbackend = "netem"')
    assert _errors(folder, text).startswith(
        "options.link_log: the netem backend keeps no packet log; use backend userspace")
    (folder / "d.txt").write_text("0 5\n")
    text = CAMPAIGN.replace("link_log = true", 'backend = "netem"').replace(
        "delay_ms = 5", 'delay_trace = "d.txt"')
    assert _errors(folder, text).startswith(
        "backend netem: network myfi: delay_trace: the netem backend cannot vary the delay")
    (folder / "c.toml").write_text(CAMPAIGN.replace("link_log = true", 'backend = "auto"'))
    assert load_campaign(folder / "c.toml").options.backend == "auto"
