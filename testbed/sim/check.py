"""The differential check: a committed packet-level run's cells rerun in the simulator.

Rules:

1. The cells, templates and schedules are the run's own (its manifest's campaign); each
   chosen cell is simulated on the first N templates the run holds, and its actions are
   paired with the run's by (cell, template, action).
2. Per cell: the median stall per action of each side (actions of every attempt the run
   kept, aborted episodes left out), their ratio sim / packet-level, and a percentile
   bootstrap interval of that ratio resampling templates (pairs stay together; seeded).
3. Per cell, the share of paired actions whose frame bytes and whose rounds are exactly
   equal: the simulator carries the testbed's own frames, so anything short of 1.0 is a
   difference in what the protocol did, not in timing.
4. Nothing here is tuned: the calibration is the one given, the model the one the sim
   backend runs.
5. With ``paper``, each cell is also run under the paper's harness model
   (``testbed.sim.paper``: one trace delay per exchange, no handshake, no CPU) and its
   median stall per action and ratio to the packet-level run are reported beside.
6. A cell whose ratio leaves [1 - TOLERANCE, 1 + TOLERANCE] gets a note naming the
   mechanism the model lacks that its traffic exposes: stall that is the node's own CPU
   (its median action has no rounds: only RPC service times are calibrated), an unshaped
   network (all of the stall is the calibration's service times), or several
   connections per round (the host's scheduling of concurrent exchanges; service times
   are constants).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.campaign.model import Campaign
from testbed.campaign.parse import recorded_campaign
from testbed.campaign.sim_support import check_campaign
from testbed.errors import UserError
from testbed.report.load import load_run
from testbed.sim.calibration import Calibration
from testbed.sim.episode import run_sim_episode
from testbed.sim.paper import MODEL as PAPER_MODEL

DRAWS = 2000
TOLERANCE = 0.10


@dataclass(frozen=True)
class CellCheck:
    """One cell's comparison (rules 2-3)."""

    cell: str
    policy: str
    connection: str
    templates: int
    actions: int
    packet_median_ms: float
    sim_median_ms: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    bytes_equal: float
    rounds_equal: float
    connections_per_round: float
    note: str
    paper_median_ms: float | None = None
    paper_ratio: float | None = None

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _median_ratio(pairs: Sequence[tuple[list[float], list[float]]]) -> float:
    sim = [s for tpl in pairs for s in tpl[0]]
    ref = [r for tpl in pairs for r in tpl[1]]
    if not sim or not ref:
        return float("nan")
    ref_median = statistics.median(ref)
    return statistics.median(sim) / ref_median if ref_median > 0 else float("nan")


def _interval(pairs: list[tuple[list[float], list[float]]], *, draws: int,
              seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    ratios = sorted(r for r in (_median_ratio([rng.choice(pairs) for _ in pairs])
                                for _ in range(draws)) if r == r)
    if not ratios:
        return float("nan"), float("nan")
    return ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def check_run(run_dir: Path, calibration: Calibration, *, policies: Sequence[str] = (),
              connections: Sequence[str] = (), templates: int = 3, draws: int = DRAWS,
              seed: int = 0, paper: bool = False, networks: Sequence[str] = ()
              ) -> list[CellCheck]:
    """Rules 1-3 for every cell of RUN_DIR whose policy and connection were asked for."""
    run = load_run(run_dir)
    config = run.manifest.get("config")
    if not isinstance(config, dict):
        raise UserError(f"{run_dir}: its manifest has no campaign config to rerun")
    campaign: Campaign = recorded_campaign(config, source=str(run_dir / "manifest.json"))
    check_campaign(campaign)
    actions = run.actions
    if "aborted" in run.episodes.columns:
        kept = run.episodes[~run.episodes["aborted"].fillna(False).astype(bool)]
        actions = actions[actions["episode"].isin(set(kept["episode"]))]
    out: list[CellCheck] = []
    for key, cells in campaign.groups():
        for cell in cells:
            if policies and cell.policy not in policies:
                continue
            if connections and cell.connection not in connections:
                continue
            if networks and cell.network not in networks:
                continue
            ref = actions[actions["cell"] == cell.id]
            held = [t for t in campaign.templates if t in set(ref["template"])][:templates]
            if not held:
                continue
            out.append(_check_cell(campaign, cell, key.central, held, ref, calibration,
                                   draws=draws, seed=seed, paper=paper))
    if not out:
        raise UserError(f"{run_dir}: no cell matches --policy {list(policies) or 'any'}, "
                        f"--connection {list(connections) or 'any'} and --network "
                        f"{list(networks) or 'any'}")
    return out


def _check_cell(campaign: Campaign, cell: Any, central: bool, held: list[str],
                ref: pd.DataFrame, calibration: Calibration, *, draws: int,
                seed: int, paper: bool) -> CellCheck:
    pairs: list[tuple[list[float], list[float]]] = []
    same_bytes = same_rounds = paired = 0
    rounds = connections = 0
    action_rounds: list[int] = []
    paper_stalls: list[float] = []
    has_rounds = "rounds" in ref.columns
    for template in held:
        result = run_sim_episode(campaign, cell, campaign.schedule(cell, template),
                                 central=central, calibration=calibration)
        if paper:
            harness = run_sim_episode(campaign, cell, campaign.schedule(cell, template),
                                      central=central, calibration=calibration,
                                      model=PAPER_MODEL)
            paper_stalls.extend(float(a["stall_ms"]) for a in harness.actions)
        theirs = ref[ref["template"] == template]
        by_action = {a: rows for a, rows in theirs.groupby("action")}
        sim_stalls: list[float] = []
        ref_stalls: list[float] = []
        for row in result.actions:
            match = by_action.get(row["action"])
            if match is None:
                continue
            sim_stalls.append(float(row["stall_ms"]))
            rounds += int(row["rounds"])
            action_rounds.append(int(row["rounds"]))
            connections += int(row["connections"])
            ref_stalls.extend(float(v) for v in match["stall_ms"])
            for _, other in match.iterrows():
                paired += 1
                same_bytes += int(int(other["bytes"]) == int(row["bytes"]))
                same_rounds += int(has_rounds and not pd.isna(other["rounds"])
                                   and int(other["rounds"]) == int(row["rounds"]))
        pairs.append((sim_stalls, ref_stalls))
    sim_all = [s for p in pairs for s in p[0]]
    ref_all = [r for p in pairs for r in p[1]]
    lo, hi = _interval(pairs, draws=draws, seed=seed)
    ratio = _median_ratio(pairs)
    per_round = connections / rounds if rounds else 0.0
    note = ""
    unshaped = campaign.network_profile(cell.network).link is None
    if not 1 - TOLERANCE <= ratio <= 1 + TOLERANCE:
        if unshaped and action_rounds and statistics.median(action_rounds) > 0:
            note = ("unshaped network: the stall is all service time, the calibration's "
                    "medians (measured at another time and load than the run)")
        elif not action_rounds or statistics.median(action_rounds) == 0:
            note = "stall is the node's own CPU: not modelled (only RPC service times are)"
        elif per_round > 1:
            note = ("several connections per round: the host's scheduling of concurrent "
                    "exchanges is not modelled (service times are constants)")
        else:
            note = "outside the band with one exchange per round: not explained yet"
    ref_median = statistics.median(ref_all) if ref_all else float("nan")
    paper_median = statistics.median(paper_stalls) if paper_stalls else None
    return CellCheck(
        cell=cell.id, policy=cell.policy, connection=cell.connection, templates=len(held),
        actions=paired, packet_median_ms=statistics.median(ref_all) if ref_all else float("nan"),
        sim_median_ms=statistics.median(sim_all) if sim_all else float("nan"),
        ratio=ratio, ratio_lo=lo, ratio_hi=hi,
        bytes_equal=same_bytes / paired if paired else float("nan"),
        rounds_equal=same_rounds / paired if paired else float("nan"),
        connections_per_round=per_round, note=note, paper_median_ms=paper_median,
        paper_ratio=None if paper_median is None or not ref_median > 0
        else paper_median / ref_median)
