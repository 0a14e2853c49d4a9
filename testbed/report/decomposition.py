"""Stall measured against stall predicted from counted rounds: the cells of the table
``testbed.report.tables_decomposition`` writes (docs/reports.md, "Stall measured vs
predicted from counted rounds").

Rules (the arithmetic is pure over the loaded frames; the one round trip per episode
comes from ``testbed.links.exchange``):

1. Per episode, the rounds its stall waited for: on the action path the actions'
   ``rounds`` (sequential RPC rounds) and ``handshake_rounds`` (2 per round that opened
   a connection: TCP's handshake, then the channel's), in barriers and owner-update
   hooks the episode's ``barrier_rounds``/``commit_rounds`` and their handshake rounds.
2. Runs made before those columns existed get them derived (the CSV's ``counts``):
   with ``fresh`` connections every round opens one (2 handshake round trips per
   round); with pooled ones an action that opened a connection opened it in one round
   (at most one new peer per action, or several at once in its first round, in every
   reference run), and hooks use the connections their policy's ``on_seed`` opened
   during setup, or ``reuse_warm`` did (a pooled policy whose ``on_seed`` sends nothing,
   e.g. majority-replica validation with ``reuse``, has no derived count).
   Hook rounds come from the schedule (``testbed.campaign.workload``, regenerated from
   the episode's parameters): one per update for central commits, quorum writes and
   registry commits, one per barrier with queued heads for metadata sync, one per
   announced update for adaptive until its rule switches (``ends_sync``). A policy with
   another on-path hook has no derived count (its prediction is left empty).
3. The round trip of the episode (``rtt_ms``): the exchange-weighted mean of the link
   model over the replay window (``replay_s``, else ``wall_s``, which adds the setup
   before the trace restart) of the episode's network, team and trace offset.
4. Predicted stall per attempted action = ((action rounds + their handshake rounds +
   hook rounds + their handshake rounds) x ``rtt_ms`` + RPC timeouts on the path x
   ``rpc_timeout_s``) / attempted actions: the report's statistic's denominator. The
   paper's model (appendix H: each framed exchange delayed by one trace delay, no
   handshake) is the same without the handshake round trips; concurrent exchanges of a
   round overlap, as the paper counts stall by elapsed time.
5. Per cell, medians over templates (completed episodes) of the measured
   ``stall_ms_per_action`` (the report's statistic) and of both predictions; the ratio
   is predicted over measured. A cell is "within" when the ratio is in [0.9, 1.1].
6. Left out of the prediction: CPU time at both ends, serialization of messages over
   one packet (``serialization_bound_ms``: every byte of the path and the hooks queued
   on one uplink at the window's mean capacity, an upper bound), and traffic queued
   ahead. Networks without links (loopback) get no table: their stall is CPU time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from protocols.policies.adaptive import ends_sync
from protocols.policies.base import Policy
from protocols.policies.registry import make_policy
from testbed.campaign.workload import Update, generate_schedule
from testbed.errors import UserError
from testbed.links.exchange import base_rtt_ms, exchange_rtt_ms
from testbed.links.linkspec import NetworkProfile
from testbed.links.profiles import network_template
from testbed.report.load import Run
from testbed.report.recorded_links import recorded_profiles
from testbed.report.stats import cost_episodes, median_iqr
from testbed.report.table_common import STALL

HANDSHAKE_ROUND_TRIPS = 2  # nodes.meter.HANDSHAKE_ROUND_TRIPS (testbed does not import it)
WITHIN = 0.10
#: Policies whose on-path ``on_update`` is one round per update (rule 2).
COMMIT_PER_UPDATE = frozenset({"centralized_lineage", "centralized_lineage_own_local",
                               "majority_replica", "session_read_set",
                               "inherited_version_set"})
COUNT_COLUMNS = ("action_rounds", "action_handshake_rounds", "hook_rounds",
                 "hook_handshake_rounds", "path_timeouts")
_DEFAULT_TIMEOUT_S = 10.0
_SCHEDULE_PARAMS = ("seed", "family", "template", "agents", "keys", "units", "deps", "rho",
                    "tier")
_FREE = ("connection", "rho", "keys", "agents", "deps", "units", "tier", "trace_offset_s",
         "batch", "backend")


# --- rule 1 and 2: counts -------------------------------------------------------------------


def action_counts(actions: pd.DataFrame) -> pd.DataFrame:
    """Per episode: rounds, handshake rounds, RPC timeouts and bytes on the action path,
    and whether the handshake rounds were recorded (rule 1) or derived (rule 2)."""
    acts = actions
    rounds = acts["rounds"].fillna(0).astype(float)
    fresh = acts["connection"].astype(str).eq("fresh")
    opened = (acts["connections"].fillna(0).astype(float) > 0).astype(float)
    derived = pd.Series(np.where(fresh, rounds, opened) * HANDSHAKE_ROUND_TRIPS,
                        index=acts.index)
    recorded = (acts["handshake_rounds"].astype(float) if "handshake_rounds" in acts
                else pd.Series(math.nan, index=acts.index))
    timeouts = (acts["rpc_timeouts"].fillna(0).astype(float) if "rpc_timeouts" in acts
                else pd.Series(0.0, index=acts.index))
    out = pd.DataFrame({"episode": acts["episode"], "action_rounds": rounds,
                        "action_handshake_rounds": recorded.fillna(derived),
                        "path_timeouts": timeouts,
                        "path_bytes": acts["bytes"].fillna(0).astype(float),
                        "_derived": recorded.isna().astype(int)})
    grouped = out.groupby("episode", sort=False).sum()
    grouped["action_source"] = np.where(grouped.pop("_derived") > 0, "derived", "recorded")
    return grouped


@cache
def _policy_hooks(spec: str) -> tuple[str, int, bool]:
    """(kind, barrier interval, whether ``on_seed`` opens the hooks' connections) of a
    policy's on-path hooks for rule 2; kinds ``none``, ``commit``, ``barrier``,
    ``adaptive`` or ``unknown``."""
    try:
        policy = make_policy(spec)
    except ValueError:  # a plugin the report process does not load
        return "unknown", 1, False
    cls = type(policy)
    name = cls.name
    seeds = cls.on_seed is not Policy.on_seed
    if name in COMMIT_PER_UPDATE:
        return "commit", 1, seeds
    if name == "metadata_sync":
        return "barrier", int(getattr(policy, "interval", 1)), seeds
    if name == "adaptive":
        return "adaptive", 1, seeds
    hooks = [h for h in ("on_update", "at_unit_end")
             if getattr(cls, h) is not getattr(Policy, h) and h not in cls.off_path_hooks]
    return ("unknown" if hooks else "none"), 1, seeds


@cache
def _update_units(params: tuple[Any, ...]) -> tuple[int, ...]:
    seed, family, template, agents, keys, units, deps, rho, tier = params
    schedule = generate_schedule(seed=int(seed), family=str(family), template=str(template),
                                 agents=int(agents), keys=int(keys), units=int(units),
                                 deps=int(deps), rho=float(rho), tier=str(tier))
    return tuple(e.unit for e in schedule.events if isinstance(e, Update))


def barriers_with_heads(update_units: tuple[int, ...], interval: int, units: int) -> int:
    """Barriers that found queued heads: windows of INTERVAL units holding an update and
    ending inside the horizon (a barrier follows unit u when (u + 1) % K == 0)."""
    windows = {u // interval for u in update_units}
    return sum(1 for w in windows if (w + 1) * interval - 1 < units)


def adaptive_announcements(update_units: tuple[int, ...]) -> int:
    """Updates adaptive announces before its rule ends sync mode: the rule is evaluated
    on each newly announced state at the unit of that announcement."""
    announced = 0
    for unit in update_units:
        announced += 1
        if ends_sync((("", announced + 1),), unit):  # seq = updates + the seed's 1
            break
    return announced


def hook_counts(episodes: pd.DataFrame) -> pd.DataFrame:
    """Per episode: rounds and handshake rounds of barriers and commits (recorded, else
    derived from the schedule: rule 2; NaN where neither can say)."""
    recorded = [c for c in ("barrier_rounds", "commit_rounds", "barrier_handshake_rounds",
                            "commit_handshake_rounds") if c in episodes]
    rows = []
    for _, ep in episodes.iterrows():
        if len(recorded) == 4 and all(pd.notna(ep[c]) for c in recorded):
            rows.append({"hook_rounds": float(ep["barrier_rounds"] + ep["commit_rounds"]),
                         "hook_handshake_rounds": float(ep["barrier_handshake_rounds"]
                                                        + ep["commit_handshake_rounds"]),
                         "hook_source": "recorded"})
            continue
        rows.append(_derived_hooks(ep))
    return pd.DataFrame(rows, index=episodes["episode"].to_numpy())


def _derived_hooks(ep: pd.Series) -> dict[str, Any]:
    kind, interval, seeds = _policy_hooks(str(ep["policy"]))
    connection = str(ep.get("connection", "fresh"))
    fresh = connection == "fresh"
    seeds = seeds or connection == "reuse_warm"  # every pool opened during setup
    unknown = {"hook_rounds": math.nan, "hook_handshake_rounds": math.nan,
               "hook_source": "unknown"}
    if kind == "none":
        return {"hook_rounds": 0.0, "hook_handshake_rounds": 0.0, "hook_source": "derived"}
    if (kind == "unknown" or (not fresh and not seeds)
            or any(c not in ep or pd.isna(ep[c]) for c in _SCHEDULE_PARAMS)):
        return unknown
    units = _update_units(tuple(ep[c] for c in _SCHEDULE_PARAMS))
    if kind == "commit":
        rounds = len(units)
    elif kind == "barrier":
        rounds = barriers_with_heads(units, interval, int(ep["units"]))
    else:
        rounds = adaptive_announcements(units)
    return {"hook_rounds": float(rounds),
            "hook_handshake_rounds": float(HANDSHAKE_ROUND_TRIPS * rounds if fresh else 0),
            "hook_source": "derived"}


# --- rule 3: the round trip -----------------------------------------------------------------


def run_profiles(run: Run) -> dict[str, NetworkProfile]:
    """The networks of a run: the manifest's recorded definitions, else the built-in
    network of that name (runs made before the manifest recorded them)."""
    profiles = recorded_profiles(run.manifest)
    for name in run.episodes["network"].dropna().unique():
        if str(name) not in profiles and (built := network_template(str(name))) is not None:
            profiles[str(name)] = built
    return profiles


def replay_window_s(episodes: pd.DataFrame) -> pd.Series:
    """Seconds of trace each episode replayed: ``replay_s``, else ``wall_s`` (rule 3)."""
    wall = (episodes["wall_s"].astype(float) if "wall_s" in episodes
            else pd.Series(math.nan, index=episodes.index))
    if "replay_s" in episodes:
        return episodes["replay_s"].astype(float).fillna(wall)
    return wall


RttOf = Callable[[NetworkProfile, int, float, float], float]


def _model_rtt(profile: NetworkProfile, agents: int, offset_s: float, window_s: float) -> float:
    return exchange_rtt_ms(profile, agents, offset_s=offset_s, window_s=round(window_s, 1))


def episode_delays(episodes: pd.DataFrame, profiles: Mapping[str, NetworkProfile],
                   rtt_of: RttOf = _model_rtt) -> pd.DataFrame:
    """Per episode: ``rtt_ms`` (rule 3), ``base_rtt_ms`` (propagation only),
    ``link_p50_rtt_ms`` (propagation plus two crossings of each direction at the
    episode's median queueing delays, where the links recorded them) and
    ``uplink_kbit`` (mean uplink capacity over the window, for the serialization
    bound)."""
    windows = replay_window_s(episodes)
    rows = []
    for (_, ep), window in zip(episodes.iterrows(), windows, strict=True):
        profile = profiles.get(str(ep["network"]))
        if profile is None or profile.link is None:
            rows.append({"rtt_ms": math.nan, "base_rtt_ms": math.nan,
                         "link_p50_rtt_ms": math.nan, "uplink_kbit": math.nan})
            continue
        agents, offset = int(ep["agents"]), float(ep.get("trace_offset_s") or 0.0)
        base = base_rtt_ms(profile, agents)
        queues = [_number(ep.get(f"link_{d}_qdelay_p50_ms")) for d in ("up", "down")]
        p50 = base + 2 * sum(queues)  # NaN where the links recorded none
        try:
            rtt = rtt_of(profile, agents, offset, float(window))
            uplink = _uplink_kbit(profile, offset, float(window))
        except (UserError, OSError, ValueError):  # a trace file this host does not have
            rtt = uplink = math.nan
        rows.append({"rtt_ms": rtt, "base_rtt_ms": base, "link_p50_rtt_ms": p50,
                     "uplink_kbit": uplink})
    return pd.DataFrame(rows, index=episodes["episode"].to_numpy())


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _uplink_kbit(profile: NetworkProfile, offset_s: float, window_s: float) -> float:
    link = profile.link
    if link is None:
        return math.nan
    side = link.side("up")
    if side.rate_kbit is not None:
        return float(side.rate_kbit)
    if side.trace is None or window_s <= 0:
        return math.nan
    from testbed.links.traces import kbit_per_opportunity_ms, load_trace_ref

    trace = load_trace_ref(side.trace, "up")
    window_ms = window_s * 1000.0
    count = trace.opportunities(0.0, window_ms, (offset_s + side.trace_offset_s) * 1000.0).size
    return kbit_per_opportunity_ms(count, window_ms)


# --- rule 4: predictions --------------------------------------------------------------------


def predict(frame: pd.DataFrame, timeout_s: float = _DEFAULT_TIMEOUT_S) -> pd.DataFrame:
    """Per episode (rule 4): ``predicted_ms`` and ``paper_model_ms`` per attempted action,
    and the count columns per attempted action. FRAME holds per episode the columns of
    :data:`COUNT_COLUMNS`, ``rtt_ms`` and ``attempted_actions``."""
    per = frame["attempted_actions"].astype(float).clip(lower=1)
    rounds = frame["action_rounds"] + frame["hook_rounds"]
    handshakes = frame["action_handshake_rounds"] + frame["hook_handshake_rounds"]
    timeouts = frame["path_timeouts"] * timeout_s * 1000.0
    out = pd.DataFrame(index=frame.index)
    out["counted_rounds_per_action"] = rounds / per
    out["counted_handshake_rounds_per_action"] = handshakes / per
    out["predicted_ms"] = ((rounds + handshakes) * frame["rtt_ms"] + timeouts) / per
    out["paper_model_ms"] = (rounds * frame["rtt_ms"] + timeouts) / per
    return out


# --- rule 5: per cell -----------------------------------------------------------------------


@dataclass(frozen=True)
class CellRow:
    key: dict[str, object]
    episodes: int
    measured_ms: float
    predicted_ms: float
    paper_model_ms: float
    rounds: float
    handshake_rounds: float
    rtt_ms: float
    base_rtt_ms: float
    link_p50_rtt_ms: float
    serialization_bound_ms: float
    source: str

    @property
    def ratio(self) -> float:
        """Predicted over measured; NaN without a prediction or without rounds (the
        stall of a cell that waits for none is CPU time, rule 6)."""
        if not (self.measured_ms > 0 and self.predicted_ms > 0):
            return math.nan
        return self.predicted_ms / self.measured_ms

    @property
    def within(self) -> bool:
        return bool(abs(self.ratio - 1.0) <= WITHIN + 1e-12)

    def record(self) -> dict[str, object]:
        return {**self.key, "episodes": self.episodes,
                "stall_ms_measured": self.measured_ms,
                "stall_ms_predicted": self.predicted_ms, "predicted_over_measured": self.ratio,
                "within_10pct": self.within if pd.notna(self.ratio) else None,
                "stall_ms_paper_model": self.paper_model_ms,
                "rounds_per_action": self.rounds,
                "handshake_rounds_per_action": self.handshake_rounds,
                "rtt_ms": self.rtt_ms, "base_rtt_ms": self.base_rtt_ms,
                "link_p50_rtt_ms": self.link_p50_rtt_ms,
                "serialization_bound_ms": self.serialization_bound_ms,
                "counts": self.source}


def _median(values: pd.Series) -> float:
    return median_iqr(values.astype(float))[0]


def cell_rows(per_episode: pd.DataFrame, keys: list[str]) -> list[CellRow]:
    """One row per cell of PER_EPISODE (rule 5); KEYS are the cell's columns."""
    out = []
    for values, part in per_episode.groupby(keys, dropna=False, sort=False):
        key = dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True))
        predicted = part["predicted_ms"]
        sources = sorted(set(part["action_source"]) | set(part["hook_source"]))
        out.append(CellRow(
            key=key, episodes=len(part), measured_ms=_median(part[STALL]),
            predicted_ms=_median(predicted) if predicted.notna().all() else math.nan,
            paper_model_ms=(_median(part["paper_model_ms"])
                            if part["paper_model_ms"].notna().all() else math.nan),
            rounds=float(part["counted_rounds_per_action"].mean()),
            handshake_rounds=float(part["counted_handshake_rounds_per_action"].mean()),
            rtt_ms=_median(part["rtt_ms"]), base_rtt_ms=_median(part["base_rtt_ms"]),
            link_p50_rtt_ms=_median(part["link_p50_rtt_ms"]),
            serialization_bound_ms=_median(part["serialization_bound_ms"]),
            source="/".join(s for s in sources if s != "recorded") or "recorded"))
    return out


def per_episode(run: Run, rtt_of: RttOf = _model_rtt) -> pd.DataFrame:
    """Completed episodes of the run's linked networks with counts, round trips and
    predictions (rules 1-4)."""
    episodes = cost_episodes(run.episodes)
    profiles = run_profiles(run)
    linked = [n for n, p in profiles.items() if p.link is not None]
    episodes = episodes[episodes["network"].astype(str).isin(linked)]
    actions = run.actions
    if episodes.empty or "rounds" not in actions or actions["rounds"].isna().all():
        return pd.DataFrame()
    actions = actions[actions["episode"].isin(episodes["episode"])]
    counts = action_counts(actions)
    frame = episodes.set_index("episode", drop=False)
    frame = frame.join(counts, how="left")
    for column in ("action_rounds", "action_handshake_rounds", "path_timeouts", "path_bytes"):
        frame[column] = frame[column].fillna(0.0)
    frame["action_source"] = frame["action_source"].fillna("recorded")
    frame = frame.join(hook_counts(episodes), how="left")
    frame = frame.join(episode_delays(episodes, profiles, rtt_of), how="left")
    frame = frame.join(predict(frame, _timeout_s(run)))
    hook_bytes = sum(frame[c].fillna(0) for c in ("barrier_bytes", "commit_bytes")
                     if c in frame)
    frame["serialization_bound_ms"] = ((frame["path_bytes"] + hook_bytes) * 8
                                       / frame["uplink_kbit"]
                                       / frame["attempted_actions"].clip(lower=1))
    return frame.reset_index(drop=True)


def _timeout_s(run: Run) -> float:
    options = (run.manifest.get("config") or {}).get("options") or {}
    value = options.get("rpc_timeout_s")
    return float(value) if isinstance(value, int | float) else _DEFAULT_TIMEOUT_S


def cell_keys(frame: pd.DataFrame) -> list[str]:
    """The columns a row of the table is grouped by: the cell's configuration and id."""
    keys = ["network", "policy"] + [c for c in _FREE if c in frame]
    return keys + (["cell"] if "cell" in frame else [])


def varying(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    """The configuration columns of KEYS that take more than one value in FRAME (the
    table shows those; the provenance line names the rest)."""
    return [k for k in keys if k not in ("network", "policy", "cell")
            and frame[k].nunique(dropna=False) > 1]


def decomposition(run: Run, rtt_of: RttOf = _model_rtt) -> list[CellRow]:
    """Every cell of the run's linked networks (rules 1-5)."""
    frame = per_episode(run, rtt_of)
    if frame.empty:
        return []
    return cell_rows(frame, cell_keys(frame))
