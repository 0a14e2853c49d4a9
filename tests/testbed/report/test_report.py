"""Report generation on synthetic schema-exact results (tests/testbed/report_fixtures.py).

Table values are recomputed here with plain pandas, independently of testbed.report.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from testbed.report import figures
from testbed.report.build import build_report
from testbed.report.figures import traces_figure
from testbed.report.link_figures import EpisodeChoiceError
from testbed.report.load import load_run
from testbed.report.naming import display_name
from testbed.report.stats import compare, practical_tie, two_stage_draws
from testbed.results.rundir import RunDirError
from tests.testbed.report.report_fixtures import ABORTED_STALL_MS, SyntheticRun, make_campaign

pytestmark = pytest.mark.slow

DRAWS = 400
ALL_POLICIES = [
    "local_replica", "owner_head_freshness", "centralized_lineage", "metadata_sync",
    "metadata_sync/2", "metadata_sync/4", "per_key_all_key", "batched_all_key", "all_replica",
    "majority_replica", "planfence",
]
ABORTS = [("centralized_lineage", "deployment-01")]


def _mixed() -> SyntheticRun:
    return make_campaign(
        "mixed",
        [
            {"policy": ALL_POLICIES},
            {"policy": ["metadata_sync", "metadata_sync/2", "centralized_lineage",
                        "batched_all_key", "planfence"], "rho": [0.25, 1.0, 16.0]},
            {"policy": ["metadata_sync", "centralized_lineage", "planfence"],
             "network": ["loopback"], "rho": [0.25, 1.0, 4.0, 16.0]},
            {"policy": ["batched_all_key", "planfence"], "keys": [8, 128],
             "trace_offset_s": [0.0, 5.0]},
            {"policy": ["batched_all_key", "planfence"], "deps": [1, 2]},
            {"policy": ["batched_all_key", "planfence"], "connection": ["fresh", "reuse"]},
        ],
        aborts=ABORTS,
        seed=3,
    )


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SyntheticRun, Path, dict[str, Any]]:
    data = _mixed()
    path = data.write(tmp_path_factory.mktemp("mixed") / "run")
    return data, path, build_report(path, draws=DRAWS, seed=1)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _slice(episodes: pd.DataFrame, **where: object) -> pd.DataFrame:
    defaults: dict[str, object] = {"network": "att", "rho": 4.0, "keys": 8, "deps": 1,
                                   "agents": 5, "units": 64, "connection": "fresh",
                                   "trace_offset_s": 0.0, "tier": "compact"}
    defaults.update(where)
    mask = pd.Series(True, index=episodes.index)
    for column, value in defaults.items():
        if value is not None:
            mask &= episodes[column] == value
    return episodes[mask]


def _ids(frame: pd.DataFrame) -> pd.Series:
    return frame["cell"] + "/" + frame["episode"]


# --- tables against independent pandas computations ----------------------------------------


def test_policy_table_matches_pandas(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d1_att.csv", keep_default_na=False)
    episodes = _slice(data.episodes)
    actions = data.actions[_ids(data.actions).isin(_ids(episodes))]
    assert sorted(table["policy"]) == sorted(ALL_POLICIES)
    for policy in ALL_POLICIES:
        row = table[table["policy"] == policy].iloc[0]
        ep = episodes[episodes["policy"] == policy]
        ac = actions[actions["policy"] == policy]
        released = ac["outcome"] == "released"
        done = ep[~ep["aborted"]]
        assert row["scheduled"] == ep["scheduled_actions"].sum()
        assert row["issued"] == released.sum()
        assert row["available"] == released.sum()
        assert row["invalid"] == (released & ac["invalid"]).sum()
        assert row["stall_ms_median"] == pytest.approx(done["stall_ms_per_action"].median())
        assert row["kib_median"] == pytest.approx(done["kib_per_action"].median())
        assert row["stall_ms_q1"] == pytest.approx(done["stall_ms_per_action"].quantile(0.25))


def test_best_and_second_marks_among_safe_current_policies(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    _, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d1_att.csv", keep_default_na=False)
    safe = table[(table["invalid"] == 0) & (table["available"] == table["scheduled"])
                 & (table["category"] == "Derivation-current")]
    ranked = safe.sort_values("stall_ms_median")["policy"].tolist()
    assert table.loc[table["stall_mark"] == "best", "policy"].tolist() == ranked[:1]
    assert table.loc[table["stall_mark"] == "second", "policy"].tolist() == ranked[1:2]
    # The aborted policy lost availability and the unsafe ones issued invalid actions:
    marked = set(table.loc[table["stall_mark"] != "", "policy"])
    assert marked.isdisjoint({"centralized_lineage", "local_replica", "metadata_sync/2"})
    markdown = (path / "tables" / "table_d1_att.md").read_text()
    best = table.loc[table["stall_mark"] == "best", "stall_ms_median"].iloc[0]
    assert f"**{best:.1f}**" in markdown


def test_aborted_episode_stays_in_denominator_not_in_costs(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d1_att.csv", keep_default_na=False)
    row = table[table["policy"] == "centralized_lineage"].iloc[0]
    ep = _slice(data.episodes, policy="centralized_lineage")
    assert row["aborted_episodes"] == 1
    assert row["scheduled"] == 11 * len(ep)
    assert row["available"] < row["scheduled"]
    assert row["stall_ms_median"] < ABORTED_STALL_MS / 10


def test_scheduled_falls_back_to_paired_episode_without_column(tmp_path: Path) -> None:
    data = make_campaign("nosched", [{"policy": ["planfence", "batched_all_key"]}],
                         aborts=[("planfence", "reservation-00")])
    episodes = data.episodes.drop(columns=["scheduled_actions"])
    path = SyntheticRun(data.manifest, data.actions, episodes).write(tmp_path / "run")
    run = load_run(path)
    aborted = run.episodes[run.episodes["aborted"]]
    assert aborted["scheduled"].tolist() == [11]
    assert aborted["attempted_actions"].tolist() == [5]


def test_rate_table_matches_pandas(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d7_att.csv")
    assert table["rho"].tolist() == [0.25, 1.0, 4.0, 16.0]
    for _, row in table.iterrows():
        ep = _slice(data.episodes, rho=row["rho"])
        ep = ep[~ep["aborted"]]
        for policy in ("metadata_sync", "centralized_lineage", "batched_all_key", "planfence"):
            expected = ep.loc[ep["policy"] == policy, "stall_ms_per_action"].median()
            assert row[f"{policy}_stall_ms_median"] == pytest.approx(expected)
        pf = ep[ep["policy"] == "planfence"].set_index("template")["stall_ms_per_action"]
        ba = ep[ep["policy"] == "batched_all_key"].set_index("template")["stall_ms_per_action"]
        both = pf.index.intersection(ba.index)
        change = pf[both].median() / ba[both].median() - 1
        assert row["planfence_vs_batched_change"] == pytest.approx(change)
        assert row["planfence_vs_batched_change_low"] <= change <= row[
            "planfence_vs_batched_change_high"]
        larger = max(pf[both].median(), ba[both].median())
        assert bool(row["planfence_vs_batched_tie"]) == bool(
            abs(pf[both].median() - ba[both].median()) < 0.1 * larger)


def test_keyspace_table_uses_median_of_offset_medians(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d5.csv")
    for _, row in table.iterrows():
        ep = _slice(data.episodes, keys=row["keys"], trace_offset_s=None,
                    policy=row["policy"])
        per_offset = ep[~ep["aborted"]].groupby("trace_offset_s")["stall_ms_per_action"].median()
        assert len(per_offset) == 2
        assert row["stall_ms_median"] == pytest.approx(per_offset.median())
        assert row["scheduled"] == ep["scheduled_actions"].sum()
    batched = table[table["policy"] == "batched_all_key"].set_index("keys")["kib_median"]
    assert batched[128] > batched[8]


def test_reuse_table_matches_pandas(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_h1_att.csv")
    assert sorted(table["policy"]) == ["batched_all_key", "planfence"]
    for _, row in table.iterrows():
        for arm in ("fresh", "reuse"):
            ep = _slice(data.episodes, policy=row["policy"], connection=arm)
            assert row[f"{arm}_connections_median"] == pytest.approx(ep["connections"].median())
            assert row[f"{arm}_stall_ms_q3"] == pytest.approx(
                ep["stall_ms_per_action"].quantile(0.75))


def test_sync_table_lists_k_per_rho(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d2_att.csv")
    at4 = table[table["rho"] == 4.0]["policy"].tolist()
    assert at4 == ["metadata_sync", "metadata_sync/2", "metadata_sync/4", "planfence"]
    for _, row in table.iterrows():
        ep = _slice(data.episodes, rho=row["rho"], policy=row["policy"])
        ac = data.actions[_ids(data.actions).isin(_ids(ep))]
        valid = ((ac["outcome"] == "released") & ~ac["invalid"]).sum()
        assert row["valid"] == valid


# --- which tables and figures are written ---------------------------------------------------


def test_every_table_file_names_its_provenance(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    _, path, summary = mixed
    assert summary["tables"]
    for name in summary["tables"]:
        # loopback runs with no link backend ("none"), shaped profiles with "userspace"
        expected = ({"none"} if name.endswith("_loopback") else
                    {"userspace"} if name.endswith("_att") else {"none", "userspace"})
        for ext in ("md", "tex"):
            text = (path / "tables" / f"{name}.{ext}").read_text()
            assert "mixed" in text
            assert any(backend in text for backend in expected)
        csv = pd.read_csv(path / "tables" / f"{name}.csv")
        assert set(csv["campaign"]) == {"mixed"}
        named = {b for value in csv["backend"] for b in str(value).split(", ")}
        assert named <= expected


def test_only_tables_with_cells_are_written(tmp_path: Path) -> None:
    data = make_campaign("scope", [{"policy": ["batched_all_key", "planfence"],
                                    "keys": [8, 32]}])
    summary = build_report(data.write(tmp_path / "run"), draws=DRAWS)
    # Table 2 would repeat D.1, so it is left out; no rate, sync, density or reuse cells.
    assert sorted(summary["tables"]) == ["paired_d1_att", "table_d1_att", "table_d5"]
    written = sorted(p.name for p in (tmp_path / "run" / "tables").iterdir())
    stems = [*summary["tables"], *([summary["paper"]] if summary["paper"] else [])]
    assert written == sorted(f"{t}.{e}" for t in stems for e in ("csv", "md", "tex"))
    names = {p.stem for p in summary["figures"]}
    assert "fig3_keys" in names
    assert "fig2_lowest_stall" not in names
    assert "figd1_validity_att" not in names


def test_full_campaign_writes_every_layout(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    _, _, summary = mixed
    expected = {"table2_att", "table_d1_att", "table_d2_att", "table_d5", "table_d6_att",
                "table_d7_att", "table_d9_att", "table_h1_att", "table_d1_loopback"}
    assert expected <= set(summary["tables"])
    assert "table_d3_att" not in summary["tables"]  # one team size only


def test_figures_written_and_non_empty(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    _, path, summary = mixed
    stems = {p.stem for p in summary["figures"]}
    assert {"fig2_lowest_stall", "fig3_keys", "figd1_validity_att", "fig_stall_vs_rho",
            "fig_trace_segments"} <= stems
    for figure in summary["figures"]:
        assert figure.parent == path / "figures"
        content = figure.read_bytes()
        if figure.suffix == ".png":
            assert content.startswith(b"\x89PNG")
            assert len(content) > 5000
        else:
            assert b"<svg" in content
            assert len(content) > 5000


def test_report_documents_link_tables_and_figures(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    _, _path, summary = mixed
    md = summary["report_md"].read_text()
    html = summary["report_html"].read_text()
    for name in summary["tables"]:
        assert f"tables/{name}.csv" in md
    for figure in summary["figures"]:
        if figure.suffix == ".png":
            assert f"figures/{figure.name}" in md
    assert html.count("data:image/png;base64,") == len(
        [f for f in summary["figures"] if f.suffix == ".png"])
    assert "What this shows" in md
    assert "<table>" in html


def test_findings_name_the_lowest_safe_stall(
    mixed: tuple[SyntheticRun, Path, dict[str, Any]],
) -> None:
    _, path, _ = mixed
    table = pd.read_csv(path / "tables" / "table_d1_att.csv", keep_default_na=False)
    best = table.loc[table["stall_mark"] == "best"].iloc[0]
    md = (path / "report.md").read_text()
    expected = f"Lowest safe stall: {display_name(best['policy'])} at " \
        f"{best['stall_ms_median']:.1f} ms/action"
    assert expected in md


def test_raw_results_are_not_rewritten(tmp_path: Path) -> None:
    path = make_campaign("raw", [{"policy": ["planfence", "metadata_sync"]}]).write(tmp_path)
    before = {p.name: _digest(p) for p in path.iterdir() if p.is_file()}
    build_report(path, draws=50)
    after = {name: _digest(path / name) for name in before}
    assert before == after


def test_report_is_deterministic(tmp_path: Path) -> None:
    data = make_campaign("det", [{"policy": ["planfence", "batched_all_key"],
                                  "rho": [1.0, 4.0]}])
    first = build_report(data.write(tmp_path / "a"), draws=300, seed=7)
    second = build_report(data.write(tmp_path / "b"), draws=300, seed=7)
    for a, b in zip(first["table_files"], second["table_files"], strict=True):
        assert a.read_text().replace(str(tmp_path / "a"), "") == b.read_text().replace(
            str(tmp_path / "b"), "")
    # figures too, byte for byte (SVG ids are salted hashes; PNGs carry no timestamp)
    assert any(f.suffix == ".svg" for f in first["figures"])
    for a, b in zip(first["figures"], second["figures"], strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "actions.parquet").write_bytes(b"")
    with pytest.raises(RunDirError, match=r"missing episodes\.parquet"):
        build_report(tmp_path)


# --- trace figure with an injected loader -----------------------------------------------------


class _FakeTrace:
    def capacity_series_kbit(self, bin_ms: int) -> np.ndarray:
        return np.linspace(1000.0, 5000.0, 240)


@pytest.mark.parametrize(
    "listing",
    [
        {"groups": {"att_o0_n5": {"key": {"network": "att", "trace_offset_s": 0.0},
                                  "up_trace": "A.up", "down_trace": "A.down"},
                    "loopback_o0_n5": {"key": {"network": "loopback"}, "up_trace": None,
                                       "down_trace": None}}},
        {"topologies": {"att": {"up_trace": "A.up", "down_trace": "A.down",
                                "trace_offset_s": 0}}},
    ],
)
def test_trace_figure_uses_loader_and_skips_failures(
    tmp_path: Path, listing: dict[str, Any]
) -> None:
    data = make_campaign("tr", [{"policy": ["planfence"], "network": ["att", "loopback"]}])
    data.manifest.update(listing)
    run = load_run(data.write(tmp_path / "run"))
    seen: list[str] = []

    def loader(name: str) -> _FakeTrace:
        seen.append(name)
        if name == "A.down":
            raise ValueError("no such trace")
        return _FakeTrace()

    paths, notes = traces_figure(run, tmp_path / "figs", loader=loader)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert len(notes) == 1
    assert "A.down" in notes[0]
    assert seen == ["A.up", "A.down"]  # listed names win over the profile catalogue
    nothing, _ = traces_figure(run, tmp_path / "figs2", loader=lambda name: object())
    assert nothing == []


# --- statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "y", "tie"),
    [(100.0, 91.0, True), (100.0, 90.0, False), (90.0, 100.0, False), (0.0, 0.0, True),
     (10.0, 0.0, False), (250.0, 230.0, True), (250.0, 220.0, False)],
)
def test_practical_tie_rule(x: float, y: float, tie: bool) -> None:
    assert practical_tie(x, y) is tie
    assert practical_tie(y, x) is tie


def _pairs(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    families = np.repeat(["a", "b", "c"], [4, 5, 3])
    b = rng.lognormal(5.5, 0.2, size=len(families))
    a = b * rng.lognormal(-0.2, 0.1, size=len(families))
    return pd.DataFrame({"family": families, "template": range(len(families)), "a": a, "b": b})


def test_bootstrap_is_seeded_and_reproducible() -> None:
    pairs = _pairs()
    first = compare(pairs, draws=2000, seed=5)
    again = compare(pairs, draws=2000, seed=5)
    other = compare(pairs, draws=2000, seed=6)
    assert first is not None
    assert other is not None
    assert first == again
    assert (first.diff_low, first.diff_high) != (other.diff_low, other.diff_high)


def test_bootstrap_interval_contains_point_estimate() -> None:
    for seed in range(5):
        result = compare(_pairs(seed), draws=2000, seed=seed)
        assert result is not None
        assert result.diff_low <= result.diff <= result.diff_high
        assert result.change_low <= result.change <= result.change_high
        assert result.diff == pytest.approx(np.median(_pairs(seed)["a"])
                                            - np.median(_pairs(seed)["b"]))


def test_bootstrap_keeps_pairs_together() -> None:
    pairs = _pairs()
    pairs["a"] = pairs["b"] + 10.0
    result = compare(pairs, draws=1000, seed=0)
    assert result is not None
    assert result.diff_low == pytest.approx(10.0)
    assert result.diff_high == pytest.approx(10.0)


def _reference_draws(families: np.ndarray, a: np.ndarray, b: np.ndarray, draws: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Loop version of the two-stage bootstrap consuming the generator the same way."""
    labels = sorted(set(families))
    groups = [np.flatnonzero(families == f) for f in labels]
    width = max(len(g) for g in groups)
    chosen = rng.integers(0, len(groups), size=(draws, len(groups)))
    u = rng.random((draws, len(groups), width))
    out_a, out_b = np.empty(draws), np.empty(draws)
    for d in range(draws):
        picked: list[int] = []
        for slot, family in enumerate(chosen[d]):
            members = groups[family]
            picked += [int(members[int(u[d, slot, j] * len(members))])
                       for j in range(len(members))]
        out_a[d], out_b[d] = np.median(a[picked]), np.median(b[picked])
    return out_a, out_b


def test_two_stage_draws_match_loop_reference() -> None:
    pairs = _pairs(2)
    fam = pairs["family"].to_numpy()
    a, b = pairs["a"].to_numpy(), pairs["b"].to_numpy()
    fast = two_stage_draws(fam, a, b, draws=300, rng=np.random.default_rng(11))
    slow = _reference_draws(fam, a, b, 300, np.random.default_rng(11))
    np.testing.assert_allclose(fast[0], slow[0])
    np.testing.assert_allclose(fast[1], slow[1])


def test_bootstrap_resamples_families() -> None:
    """With all templates of a family identical, only the family stage creates spread."""
    pairs = pd.DataFrame({"family": ["x"] * 3 + ["y"] * 3 + ["z"] * 3,
                          "template": range(9),
                          "a": [1.0] * 3 + [2.0] * 3 + [3.0] * 3,
                          "b": [0.0] * 9})
    low_high = compare(pairs, draws=4000, seed=0)
    assert low_high is not None
    assert low_high.diff_low == pytest.approx(1.0)
    assert low_high.diff_high == pytest.approx(3.0)


def test_density_and_team_tables_match_pandas(tmp_path: Path) -> None:
    data = make_campaign("dens", [
        {"policy": ["batched_all_key", "planfence", "planfence_grouped"], "deps": [1, 2, 8]},
        {"policy": ["centralized_lineage", "metadata_sync", "planfence", "local_replica"],
         "agents": [3, 5, 8]},
    ])
    summary = build_report(data.write(tmp_path / "run"), draws=DRAWS)
    assert {"table_d6_att", "table_d3_att"} <= set(summary["tables"])
    d6 = pd.read_csv(tmp_path / "run" / "tables" / "table_d6_att.csv")
    assert d6["deps"].tolist() == [1, 2, 8]
    for _, row in d6.iterrows():
        for policy in ("batched_all_key", "planfence", "planfence_grouped"):
            ep = _slice(data.episodes, deps=row["deps"], policy=policy)
            assert row[f"{policy}_kib_median"] == pytest.approx(ep["kib_per_action"].median())
            assert row[f"{policy}_scheduled"] == ep["scheduled_actions"].sum()
    d3 = pd.read_csv(tmp_path / "run" / "tables" / "table_d3_att.csv")
    assert "local_replica" not in set(d3["policy"])  # unsafe controls stay out of D.3
    for _, row in d3.iterrows():
        ep = _slice(data.episodes, agents=row["agents"], policy=row["policy"])
        assert row["stall_ms_median"] == pytest.approx(ep["stall_ms_per_action"].median())
    md = (tmp_path / "run" / "tables" / "table_d6_att.md").read_text()
    for _, row in d6.iterrows():
        stalls = sorted(row[f"{p}_stall_ms_median"] for p in
                        ("batched_all_key", "planfence", "planfence_grouped"))
        bold = f"**{stalls[0]:.1f}**" in md
        assert bold == (stalls[1] - stalls[0] >= 0.1 * stalls[1])


def test_paired_table_matches_pandas(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    table = pd.read_csv(path / "tables" / "paired_d1_att.csv")
    ep = _slice(data.episodes)
    ep = ep[~ep["aborted"]]
    pf = ep[ep["policy"] == "planfence"].set_index("template")
    assert "planfence" not in set(table["policy"])
    for _, row in table.iterrows():
        other = ep[ep["policy"] == row["policy"]].set_index("template")
        both = pf.index.intersection(other.index)
        assert row["stall_pairs"] == len(both)
        for metric, prefix in (("stall_ms_per_action", "stall"), ("kib_per_action", "kib")):
            a, b = pf.loc[both, metric].median(), other.loc[both, metric].median()
            if b == 0:  # local replica has no stall: a relative change is undefined
                assert np.isnan(row[f"{prefix}_change"])
            else:
                assert row[f"{prefix}_change"] == pytest.approx(a / b - 1)
            assert row[f"{prefix}_diff_low"] <= a - b <= row[f"{prefix}_diff_high"]
    assert table.loc[table["policy"] == "centralized_lineage", "stall_pairs"].iloc[0] == 8


def test_tolerates_extra_and_missing_optional_columns(tmp_path: Path) -> None:
    data = make_campaign("loose", [{"policy": ["planfence", "metadata_sync"],
                                    "rho": [1.0, 4.0]}],
                         aborts=[("planfence", "fulfillment-02")])
    episodes = data.episodes.drop(columns=["units", "schedule_digest", "scheduled_actions",
                                           "stall_action_ms", "wall_s"])
    episodes["something_new"] = 1
    actions = data.actions.drop(columns=["units", "block_reason"]).assign(extra="x")
    path = SyntheticRun(data.manifest, actions, episodes).write(tmp_path / "run")
    summary = build_report(path, draws=100)
    assert "table_d7_att" in summary["tables"]
    d1 = pd.read_csv(path / "tables" / "table_d1_att.csv")
    planfence = d1[d1["policy"] == "planfence"].iloc[0]
    assert planfence["scheduled"] == 11 * 9  # the aborted slots are still scheduled
    assert planfence["available"] == 11 * 8 + 5


def test_lowest_stall_cells_match_pandas(mixed: tuple[SyntheticRun, Path, dict[str, Any]]) -> None:
    data, path, _ = mixed
    _, _, summary = mixed
    assert summary["figure_data"] == [path / "figures" / "fig2_lowest_stall.csv"]
    cells = pd.read_csv(path / "figures" / "fig2_lowest_stall.csv")
    assert set(cells["network"]) == {"att", "loopback"}
    assert len(cells) == 8  # two networks x four rates, fresh connections only
    for _, cell in cells.iterrows():
        ep = _slice(data.episodes, network=cell["network"], rho=cell["rho"])
        ep = ep[~ep["aborted"] & ep["policy"].isin(
            ["metadata_sync", "centralized_lineage", "planfence"])]
        medians = ep.groupby("policy")["stall_ms_per_action"].median().sort_values()
        assert cell["winner"] == medians.index[0]
        assert cell["runner_up"] == medians.index[1]
        assert cell["ratio"] == pytest.approx(medians.iloc[1] / medians.iloc[0])
        assert bool(cell["tie"]) == (medians.iloc[1] - medians.iloc[0] < 0.1 * medians.iloc[1])


# --- links: health lines, flagged episodes, link plots from packet logs ----------------------


def _write_log(path: Path, *, rate_opps_per_ms: int, packets: int) -> None:
    """A Mahimahi-format log written by the emulator's own writer."""
    import io

    from testbed.links.linklog import LinkLog
    from testbed.links.model import LinkQueue, TraceOpportunities

    opps = TraceOpportunities([1] * rate_opps_per_ms, 1)
    q = LinkQueue(opps, queue_packets=1000)
    handle = io.StringIO()
    q.log = LinkLog(handle, origin_ms=0.0, opportunities=opps, header=["test"])
    for i in range(packets):
        q.offer(i, 1500, i * 0.5)
        q.advance(i * 0.5)
    q.advance(packets + 10.0)
    path.write_text(handle.getvalue())


def _linked_run(tmp_path: Path) -> Path:
    from testbed.report.link_figures import LATE_LIMIT_MS

    data = make_campaign("ln", [{"policy": ["planfence"], "network": ["att", "loopback"]}])
    ep = data.episodes
    att = ep["network"] == "att"
    ep["link_up_qdelay_p50_ms"] = np.where(att, 3.0, np.nan)
    ep["link_up_qdelay_p95_ms"] = np.where(att, 9.0, np.nan)
    ep["link_down_qdelay_p50_ms"] = np.where(att, 1.0, np.nan)
    ep["link_down_qdelay_p95_ms"] = np.where(att, 2.0, np.nan)
    ep["link_up_utilisation"] = np.where(att, 0.25, np.nan)
    ep["link_down_utilisation"] = np.where(att, 0.1, np.nan)
    ep["link_up_drops"] = 0
    ep["link_down_drops"] = 0
    ep["emulator_late_p99_ms"] = np.where(att, 0.1, np.nan)
    ep["emulator_late_max_ms"] = np.where(att, 0.3, np.nan)
    first = ep[att].index[0]
    ep.loc[first, "emulator_late_p99_ms"] = LATE_LIMIT_MS + 2.5
    ep.loc[first, "emulator_late_max_ms"] = 12.0
    logged = ep.loc[first, "episode"]
    folder = f"links/{str(logged).replace('/', '~')}"
    ep["link_log"] = None
    ep.loc[first, "link_log"] = folder
    run = data.write(tmp_path / "run")
    (run / folder).mkdir(parents=True)
    for host in ("a0", "a1"):
        _write_log(run / folder / f"{host}.up.log", rate_opps_per_ms=1, packets=400)
        _write_log(run / folder / f"{host}.down.log", rate_opps_per_ms=2, packets=400)
    return run


def test_report_flags_late_episodes_and_draws_the_link_plots(tmp_path: Path) -> None:
    run = _linked_run(tmp_path)
    summary = build_report(run, draws=50)
    episodes = load_run(run).episodes
    flagged = episodes.loc[episodes["emulator_late_p99_ms"].idxmax(), "episode"]
    text = summary["report_md"].read_text()
    assert "## Links" in text
    assert f"FLAGGED {flagged}: emulator lateness p99 3.50 ms, max 12.00 ms" in text
    assert "att: median over" in text
    assert "queueing delay p50/p95 up 3/9 ms" in text
    stems = {p.stem for p in summary["figures"]}
    assert "fig_link_att" in stems
    assert "fig_link_loopback" not in stems  # nothing logged there
    png = run / "figures" / "fig_link_att.png"
    assert png.read_bytes().startswith(b"\x89PNG")


def test_report_episode_choice(tmp_path: Path) -> None:
    run = _linked_run(tmp_path)
    logged = load_run(run).episodes.dropna(subset=["link_log"]).iloc[0]["episode"]
    summary = build_report(run, draws=50, episode=str(logged))
    assert "fig_link_episode" in {p.stem for p in summary["figures"]}
    folder_form = build_report(run, draws=50, episode=str(logged).replace("/", "~"))
    assert "fig_link_episode" in {p.stem for p in folder_form["figures"]}
    with pytest.raises(EpisodeChoiceError, match=r"^--episode: 'no/such' is not an episode "
                                                 r"of this run; logged episodes include "):
        build_report(run, draws=50, episode="no/such")


def test_trace_figure_plots_the_recorded_files(tmp_path: Path) -> None:
    (tmp_path / "mine.up").write_text("1\n")  # 12 Mbit/s
    data = make_campaign("tf", [{"policy": ["planfence"], "network": ["att"]}])
    data.manifest["networks"] = {"att": {"files": [
        {"role": "up_trace", "path": str(tmp_path / "mine.up"), "ref": "mine.up",
         "host": "central", "trace_offset_s": 2.0}]}}
    run = load_run(data.write(tmp_path / "run"))
    spec = figures.trace_specs(run)["att"]["traces"]
    assert spec == [{"ref": "mine.up", "label": "mine.up (host central)", "direction": "up",
                     "path": str(tmp_path / "mine.up"), "offset_s": 2.0}]
    paths, notes = traces_figure(run, tmp_path / "figs")
    assert notes == []
    assert [p.suffix for p in paths] == [".png", ".svg"]
