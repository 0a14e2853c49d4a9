"""Campaign files, validation and the grid (testbed.campaign)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocols.policies import policy_names
from testbed.campaign.model import CampaignError
from testbed.campaign.parse import load_campaign, parse_campaign, preset_names
from testbed.links.profiles import profile_names
from tests.testbed.run.fake_runner import (
    SMALL,
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return path


BASE_TOML = """
name = "t"
seed = 1
templates = 3
[grid]
policy = ["planfence"]
network = ["loopback"]
"""

# --- presets and loading ----------------------------------------------------------------


def test_presets_all_load_with_the_documented_sizes() -> None:
    sizes = {name: len(load_campaign(name).episodes()) for name in preset_names()}
    assert sizes == {"demo": 60, "primary": 390, "rates": 2880, "scope": 1200,
                     "density": 270, "reuse": 900, "teams": 72, "horizon": 27,
                     "replanning": 1560, "handoff": 270, "batches": 600, "artifact": 320,
                     "budget": 1020, "live": 90, "live_fresh_before": 90,
                     "live_overlap": 36, "selector": 1134}


def test_demo_preset_matches_the_issue() -> None:
    demo = load_campaign("demo")
    cells = demo.cells()
    assert {c.policy for c in cells} == {"planfence", "batched_all_key", "metadata_sync",
                                        "centralized_lineage", "owner_head_freshness"}
    assert {c.network for c in cells} == {"loopback", "att"}
    assert {c.rho for c in cells} == {1.0, 4.0}
    assert {(c.agents, c.keys, c.connection) for c in cells} == {(5, 8, "reuse")}
    assert demo.templates == ("reservation-01", "fulfillment-01", "deployment-01")


def test_load_by_path_equals_parse(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE_TOML)
    loaded = load_campaign(path)
    assert loaded.cells() == parse_campaign({"name": "t", "seed": 1, "templates": 3, "grid": {
        "policy": ["planfence"], "network": ["loopback"]}}).cells()
    assert loaded.source == str(path)


@pytest.mark.parametrize(("arg", "message"), [
    ("nosuch", "campaign: 'nosuch' is neither a file nor a preset; presets: artifact, "
               "batches, budget, demo, density, handoff, horizon, live, "
               "live_fresh_before, live_overlap, primary, rates, replanning, reuse, "
               "scope, selector, teams"),
    ("missing/x.toml", "campaign: 'missing/x.toml' is not a file (no such file); presets: "
                       "artifact,"),
])
def test_unknown_campaign_lists_presets(arg: str, message: str) -> None:
    with pytest.raises(CampaignError) as info:
        load_campaign(arg)
    assert str(info.value).startswith(message)


# --- validation: one line naming the field and the allowed values ------------------------

_BAD = [
    ("rho = [3]", "grid.rho: 3 is not allowed; allowed: 0.25, 0.5, 1, 2, 4, 8, 16"),
    ("rho = [4, 4]", "grid.rho: 4 is listed twice; list each value once"),
    ("rho = []", "grid.rho: empty list; list at least one value"),
    ('network = ["mars"]', "grid.network: 'mars' is not allowed; allowed: "
                           f"{', '.join(profile_names())}"),
    ('policy = ["fastest"]', "grid.policy: 'fastest' is not allowed; allowed: "
                             f"{', '.join(policy_names())}, metadata_sync/K "
                             "with K in 1, 2, 4, 8, 16"),
    ('policy = ["metadata_sync/3"]', "grid.policy: 'metadata_sync/3' is not allowed;"),
    ('policy = ["planfence/2"]', "grid.policy: 'planfence/2' is not allowed;"),
    ('connection = ["pooled"]', "grid.connection: 'pooled' is not allowed; allowed: fresh, "
                                "reuse"),
    ('tier = ["large"]', "grid.tier: 'large' is not allowed; allowed: compact, artifact"),
    ("keys = [200]", "grid.keys: 200 is not allowed; allowed: integers 1..128"),
    ("keys = [true]", "grid.keys: True is not allowed; allowed: integers 1..128"),
    ("agents = [1]", "grid.agents: 1 is not allowed; allowed: integers 2..10000"),
    ("units = [2]", "grid.units: 2 is not allowed; allowed: integers 4..4096"),
    ("keys = [8]\ndeps = [9]", "grid.deps: 9 exceeds grid.keys 8; allowed: deps <= keys"),
    ("trace_offset_s = [-5]", "grid.trace_offset_s: -5 is not allowed; allowed: numbers >= 0"),
    ("rate = [1]", "grid: unknown field 'rate'; allowed: policy, network, trace_offset_s, rho,"
                   " keys, agents, deps, connection, tier, units"),
]


@pytest.mark.parametrize(("line", "message"), _BAD)
def test_bad_grid_values(tmp_path: Path, line: str, message: str) -> None:
    kept = [x for x in BASE_TOML.splitlines() if x.split(" = ")[0] not in
            {y.split(" = ")[0] for y in line.splitlines()}]
    _assert_error(tmp_path, "\n".join([*kept, line, ""]), message)


@pytest.mark.parametrize(("text", "message"), [
    (BASE_TOML.replace("templates = 3", "templates = 31"),
     "templates: 31 is not allowed; allowed: a count 1..30 or a list of template ids"),
    (BASE_TOML.replace("templates = 3", 'templates = ["cruise-01"]'),
     "templates: 'cruise-01' is not allowed; allowed: <family>-NN with family in "
     "reservation, fulfillment, deployment and NN in 01..10"),
    (BASE_TOML.replace("seed = 1", "seed = -1"),
     "seed: -1 is not allowed; allowed: an integer 0..9223372036854775807 (2**63 - 1)"),
    (BASE_TOML.replace("seed = 1", "seed = 9223372036854775808"),
     "seed: 9223372036854775808 is not allowed; allowed: an integer 0..9223372036854775807"),
    (BASE_TOML.replace("seed = 1", f"seed = {2**64}"),
     f"seed: {2**64} is not allowed; allowed: an integer 0..9223372036854775807"),
    (BASE_TOML.replace("seed = 1\n", ""), "seed: missing; a campaign needs name, seed,"),
    (BASE_TOML.replace('name = "t"', 'name = "my run"'), "name: 'my run' is not allowed;"),
    (BASE_TOML.replace('policy = ["planfence"]\n', ""),
     "grid.policy: missing; list at least one value"),
    (BASE_TOML + "[options]\nbackend = 'kernel'\n",
     "options.backend: 'kernel' is not allowed; allowed: auto, userspace, netem, sim"),
    (BASE_TOML + "[options]\ndurability = 'none'\n",
     "options.durability: 'none' is not allowed; allowed: full, normal"),
    (BASE_TOML + "[options]\nwire_encoding = 'xml'\n",
     "options.wire_encoding: 'xml' is not allowed; allowed: msgpack, json"),
    (BASE_TOML + "[options]\nrpc_timeout_s = 0\n",
     "options.rpc_timeout_s: 0 is not allowed; allowed: a number > 0"),
    (BASE_TOML + "[options]\nretries = 2\n", "options: unknown field 'retries'; allowed: "
                                            "rpc_timeout_s, durability, backend, delay_ms, "
                                            "episode_timeout_s"),
    ("owner = 'me'\n" + BASE_TOML, "campaign: unknown field 'owner'; allowed: name, seed,"),
    (BASE_TOML.replace("[grid]", "[[grid]]") + "[[grid]]\npolicy = ['planfence']\n"
     "network = ['att']\nrho = [3]\n",
     "grid[1].rho: 3 is not allowed; allowed: 0.25, 0.5, 1, 2, 4, 8, 16"),
    (BASE_TOML + "rho = [4\n", "campaign.toml: invalid TOML:"),
])
def test_bad_campaign_files(tmp_path: Path, text: str, message: str) -> None:
    _assert_error(tmp_path, text, message)


def test_the_largest_seed_is_the_largest_the_results_record() -> None:
    """A seed the parser takes runs: its schedule digest packs it and its episode rows
    record it in the seed column (a signed 64-bit integer)."""
    import pyarrow as pa

    from testbed.campaign.workload import MAX_SEED
    from testbed.results.schema import EPISODE_SCHEMA

    seed_type = EPISODE_SCHEMA.field("seed").type
    assert 2 ** (seed_type.bit_width - 1) - 1 == MAX_SEED
    campaign = parse_campaign({"name": "t", "seed": MAX_SEED, "templates": 1,
                               "grid": {"policy": "planfence", "network": "loopback"}})
    assert campaign.schedule(campaign.cells()[0], campaign.templates[0]).digest
    assert pa.array([campaign.seed], type=seed_type).to_pylist() == [MAX_SEED]


def _assert_error(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CampaignError) as info:
        load_campaign(path)
    text_out = str(info.value)
    assert text_out.startswith(message.replace("campaign.toml", str(path)))
    assert "\n" not in text_out


# --- the grid ---------------------------------------------------------------------------


def test_grid_expands_to_the_product_with_defaults() -> None:
    campaign = parse_campaign(SMALL)
    cells = campaign.cells()
    assert len(cells) == 3 * 2 * 2
    assert {(c.keys, c.deps, c.connection, c.tier, c.trace_offset_s) for c in cells} == \
        {(8, 1, "fresh", "compact", 0.0)}
    assert len({c.id for c in cells}) == len(cells)
    assert cells[0].id == "planfence_loopback_o0_r1_x8_n3_d1_fresh_compact_t16"


def test_grid_slices_union_without_duplicates() -> None:
    reuse = load_campaign("reuse")
    cells = reuse.cells()
    assert len(cells) == len(set(cells)) == 3 * 4 * 2 + 2 * 2 * 2 - 2


def test_episodes_keep_topology_groups_contiguous() -> None:
    campaign = load_campaign("demo")
    episodes = campaign.episodes()
    assert len(episodes) == len(campaign.cells()) * 3
    sequence = [c.group_key for c, _ in episodes]
    runs = [k for i, k in enumerate(sequence) if i == 0 or sequence[i - 1] != k]
    assert len(runs) == len(set(runs)) == 4
    central = [c for c, _ in episodes if c.group_key.central]
    assert {c.policy for c in central} == {"centralized_lineage"}
    first_group = [t for c, t in episodes if c.group_key == sequence[0]]
    assert first_group[:4] == ["reservation-01"] * 4, "templates are the outer loop"


def test_schedules_identical_across_policies_networks_connections() -> None:
    campaign = load_campaign("reuse")
    digests: dict[tuple[Any, ...], set[str]] = {}
    for cell in campaign.cells():
        key = (cell.rho, cell.keys, cell.agents, cell.deps, cell.units, cell.tier)
        digests.setdefault(key, set()).add(campaign.schedule(cell, "deployment-04").digest)
    assert all(len(d) == 1 for d in digests.values())
    assert len({next(iter(d)) for d in digests.values()}) == len(digests)


def test_with_templates_keeps_everything_else() -> None:
    demo = load_campaign("demo")
    one = demo.with_templates(1)
    assert one.templates == ("reservation-01",)
    assert one.cells() == demo.cells()
    with pytest.raises(CampaignError, match=r"^templates: 0 is not allowed"):
        demo.with_templates(0)

