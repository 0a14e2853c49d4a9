"""Explainable costs of an episode: traffic by phase, without handshakes, and rounds.

Rules (docs/campaigns.md, "Result columns"; the cost model of appendix E.1):

1. Traffic is frame bytes, each frame counted once at its sender, summed over every
   node (handshakes included: ``kib_per_action``). ``kib_per_action_payload`` leaves out
   the channel handshake frames (``handshake_bytes``), which is what the paper's
   "reuse leaves framed traffic unchanged" compares.
2. The episode's traffic is split by phase: ``setup`` (seeding and its ``on_seed``
   hooks, before the first event), ``planning`` (derivations and handoffs), the action
   path (``query``, ``fetch``, ``revalidation``, per action from the executor's round
   meter), ``commit`` (owner-update hooks: central commits, quorum writes,
   announcements on update) and ``barrier`` (synchronisation barriers, measured as the
   rest). Operations run one at a time, so each operation's bytes at the node that
   initiated every exchange in it are exactly its traffic and the phases add up to the
   total; only barriers run on every node at once, which is why they are the remainder
   (zero for a policy without barriers: tests check it).
3. ``rounds`` per action are the sequential RPC rounds on the action path
   (``nodes.meter``); ``rounds_per_action`` is their mean over the attempted actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.results.schema import COST_ACTION_FIELDS

ACTION_PHASES = ("query", "fetch", "revalidation")


@dataclass
class PhaseTally:
    """Traffic of the operations other than actions (bytes)."""

    setup: int = 0
    planning: int = 0
    commit: int = 0


def action_costs(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The explainable-cost columns of one action from its ``act`` reply."""
    out: dict[str, Any] = {}
    for name in COST_ACTION_FIELDS:
        value = reply.get(name, 0)
        out[name] = float(value) if name.endswith("_ms") else int(value)
    return out


def total_sent(counters: Mapping[str, Mapping[str, int]], field: str = "bytes_sent") -> int:
    return sum(int(c.get(field, 0)) for c in counters.values())


def episode_costs(counters: Mapping[str, Mapping[str, int]], tally: PhaseTally,
                  actions: Sequence[Mapping[str, Any]], attempted: int) -> dict[str, Any]:
    """The explainable-cost columns of an episode (module rules)."""
    sent = total_sent(counters)
    handshakes = total_sent(counters, "handshake_bytes_sent")
    path = {p: sum(int(a.get(f"{p}_bytes", 0)) for a in actions) for p in ACTION_PHASES}
    acted = sum(int(a.get("bytes", 0)) for a in actions)
    barrier = sent - tally.setup - tally.planning - tally.commit - acted
    per = max(attempted, 1)
    return {
        "kib_per_action_payload": (sent - handshakes) / 1024 / per,
        "handshake_bytes": handshakes,
        "setup_bytes": tally.setup,
        "planning_bytes": tally.planning,
        **{f"{p}_bytes": path[p] for p in ACTION_PHASES},
        "barrier_bytes": barrier,
        "commit_bytes": tally.commit,
        "rounds_per_action": sum(int(a.get("rounds", 0)) for a in actions) / per,
    }


@dataclass
class StallTally:
    """Stall of one episode by where it was spent (ms), and the sequential rounds the
    barriers and commits waited for (a barrier's: its slowest member's)."""

    action_ms: float = 0.0
    barrier_ms: float = 0.0
    commit_ms: float = 0.0
    barrier_rounds: int = 0
    barrier_handshake_rounds: int = 0
    commit_rounds: int = 0
    commit_handshake_rounds: int = 0
