"""The disturbance verdict: could the host have moved this episode's stall by more than
the run's resolution?

Rules this module obeys (pure: no I/O but reading the calibration file):

1. The run's resolution is :data:`RESOLUTION` of the stall (half the 10% tie band of
   testbed/report/stats.py): contention that moved an episode's stall by less cannot
   make or break a tie, so it does not flag the episode.
2. Each raw measure gives a bound on how far it can have moved the stall per action,
   and the episode is ``disturbed`` when a bound exceeds the resolution
   (``disturbed_reason`` names each such measure with its bound):

   * run-queue wait: a team's own contention (its nodes and the controller sharing the
     host's CPUs, on an idle host too, alike in every policy and run) is not a
     disturbance; what is counted is the wait above the share of runnable time the team
     waits when alone (``own_wait_share``, measured, else :data:`WAIT_SHARE`): ``excess =
     wait - s/(1-s) x cpu``. The bound is the sensitivity ``k`` of the episode's kind of
     network times the excess wait per action. Both are measured (``testbed bench
     disturbance``: ``k`` is the stall change per ms of injected run-queue wait, upper
     end of its 95% interval) and read from the calibration file; on loopback stall is
     CPU work and more of the wait reaches it than on an emulated link, where most of
     the stall is link time.
   * steal: when the hypervisor took more than :data:`STEAL_PCT` of the host's CPU time,
     the bound is ``k`` times the CPU time it took from the nodes' work per action
     (``steal / (1 - steal)`` of their CPU time per action).
   * oversleep: the worst node's 99th-percentile timer lateness above
     :data:`OVERSLEEP_P99_MS` (a virtual CPU the hypervisor did not run, which no
     counter inside the guest sees); flagged as before, no bound.
   * emulator lateness: the link emulator's worst release lateness, which delays every
     packet in flight, above :data:`RESOLUTION` of the episode's whole stall (a frozen
     emulator stalls the action waiting on it by that much).
3. ``host busy`` is information, never a verdict: :func:`host_busy` names a busy host.
4. The verdict's version and calibration go into each run's manifest; reports recompute
   the verdict of runs made under an earlier one from their raw columns (:func:`rejudge`
   on a frame), keeping the recorded one as ``disturbed_recorded``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

#: Half the 10% tie band: what the verdict lets contention move the stall by.
RESOLUTION = 0.05
WAIT_SHARE = 0.10
OVERSLEEP_P99_MS = 20.0
STEAL_PCT = 5.0
#: Before a calibration exists: all wait reaches the stall (the loosest bound).
UNCALIBRATED_K = 1.0
VERDICT_VERSION = 2
CALIBRATION_PATH = Path(__file__).with_name("disturbance.json")
KINDS = ("loopback", "link")
BUSY_PCT = 50.0


@cache
def calibration() -> dict[str, Any]:
    """The measured sensitivities (``sensitivity: {kind: k}``) and where they came from."""
    try:
        data = json.loads(CALIBRATION_PATH.read_text())
    except (OSError, ValueError):
        return {"sensitivity": {}, "measured": None}
    return data if isinstance(data, dict) else {"sensitivity": {}, "measured": None}


def sensitivity(kind: str) -> float:
    value = (calibration().get("sensitivity") or {}).get(kind)
    return float(value) if isinstance(value, int | float) else UNCALIBRATED_K


def own_wait_share(kind: str) -> float:
    value = (calibration().get("own_wait_share") or {}).get(kind)
    return float(value) if isinstance(value, int | float) else WAIT_SHARE


def write_calibration(sensitivities: Mapping[str, float], own_shares: Mapping[str, float],
                      *, source: str, revision: str, measured_at: str) -> None:
    """Write the calibration file (``testbed bench disturbance --write-calibration``)."""
    data = {"version": VERDICT_VERSION, "resolution": RESOLUTION,
            "sensitivity": {k: round(float(v), 4) for k, v in sorted(sensitivities.items())},
            "own_wait_share": {k: round(float(v), 4) for k, v in sorted(own_shares.items())},
            "measured": {"source": source, "revision": revision, "at": measured_at}}
    CALIBRATION_PATH.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    calibration.cache_clear()


def describe() -> dict[str, Any]:
    """What a manifest records of the verdict in force (rule 4)."""
    return {"version": VERDICT_VERSION, "resolution": RESOLUTION, "wait_share": WAIT_SHARE,
            "steal_pct": STEAL_PCT, "oversleep_p99_ms": OVERSLEEP_P99_MS,
            "sensitivity": {kind: sensitivity(kind) for kind in KINDS},
            "own_wait_share": {kind: own_wait_share(kind) for kind in KINDS},
            "measured": calibration().get("measured")}


def bound_ms(columns: Mapping[str, Any], *, actions: int, shaped: bool = False) -> float:
    """How far the host's contention can have moved the stall per action (ms): the
    larger of the run-queue and steal bounds of rule 2 (0 where nothing was measured)."""
    kind = "link" if shaped else "loopback"
    k, own = sensitivity(kind), own_wait_share(kind)
    runq = _number(columns.get("node_runq_wait_ms"))
    cpu = _number(columns.get("node_cpu_ms")) or 0.0
    bounds = [0.0]
    if runq is not None and actions > 0 and runq + cpu > 0 and runq / (runq + cpu) > own:
        bounds.append(k * max(0.0, runq - own / (1.0 - own) * cpu) / actions)
    steal = _number(columns.get("host_steal_pct"))
    if steal is not None and steal > STEAL_PCT and actions > 0:
        bounds.append(k * min(steal, 99.0) / (100.0 - min(steal, 99.0)) * cpu / actions)
    return max(bounds)


def judge(columns: Mapping[str, Any], *, stall_ms_per_action: float | None, actions: int,
          shaped: bool = False) -> tuple[bool, str]:
    """(disturbed, reason) from an episode's raw measures (rule 2); pure."""
    reasons = []
    stall = _number(stall_ms_per_action) or 0.0
    limit = RESOLUTION * stall
    kind = "link" if shaped else "loopback"
    k, own = sensitivity(kind), own_wait_share(kind)
    runq = _number(columns.get("node_runq_wait_ms"))
    cpu = _number(columns.get("node_cpu_ms")) or 0.0
    if runq is not None and actions > 0 and runq + cpu > 0:
        share = runq / (runq + cpu)
        excess = max(0.0, runq - own / (1.0 - own) * cpu) / actions
        bound = k * excess
        if share > own and bound > limit:
            reasons.append(f"runq_wait could move stall {bound:.2f} ms/action > {limit:.2f} "
                           f"({RESOLUTION:.0%}; k {k:.3g} x {excess:.2f} ms/action waited "
                           f"beyond the team's own {own:.0%} of runnable time, {share:.0%} "
                           "in all)")
    steal = _number(columns.get("host_steal_pct"))
    if steal is not None and steal > STEAL_PCT and actions > 0:
        stolen = min(steal, 99.0) / (100.0 - min(steal, 99.0)) * cpu / actions
        bound = k * stolen
        if bound > limit:
            reasons.append(f"steal {steal:.1f}% could move stall {bound:.2f} ms/action > "
                           f"{limit:.2f}")
    oversleep = _number(columns.get("node_oversleep_p99_ms"))
    if oversleep is not None and oversleep > OVERSLEEP_P99_MS:
        reasons.append(f"oversleep_p99 {oversleep:.1f} ms > {OVERSLEEP_P99_MS:g}")
    late = _number(columns.get("emulator_late_max_ms"))
    whole = RESOLUTION * stall * max(actions, 1)
    if late is not None and shaped and late > max(whole, OVERSLEEP_P99_MS):
        reasons.append(f"emulator late {late:.0f} ms > {max(whole, OVERSLEEP_P99_MS):.0f} "
                       f"({RESOLUTION:.0%} of the episode's stall)")
    return bool(reasons), "; ".join(reasons)


def host_busy(columns: Mapping[str, Any]) -> str | None:
    """Rule 3: a line saying the host was busy, or None."""
    busy = _number(columns.get("host_busy_pct"))
    if busy is not None and busy > BUSY_PCT:
        return f"host busy {busy:.0f}%"
    return None


def rejudge(rows: Any) -> Any:
    """Rule 4: a copy of an episode frame (pandas) with ``disturbed`` and
    ``disturbed_reason`` recomputed from the raw columns under this verdict, the recorded
    ones kept as ``disturbed_recorded`` and ``disturbed_reason_recorded``, and
    ``disturbance_bound_pct``: how far the host can have moved the stall, in percent of
    it (:func:`bound_ms`); rows without raw measures keep theirs."""
    frame = rows.copy()
    if "node_runq_wait_ms" not in frame or "disturbed" not in frame:
        return frame
    frame["disturbed_recorded"] = frame["disturbed"]
    if "disturbed_reason" in frame:
        frame["disturbed_reason_recorded"] = frame["disturbed_reason"]
    verdicts: list[Any] = []
    reasons: list[Any] = []
    bounds: list[float | None] = []
    for record in frame.to_dict("records"):
        measured = any(_number(record.get(c)) is not None
                       for c in ("node_runq_wait_ms", "host_steal_pct"))
        if not measured or bool(record.get("aborted")):
            verdicts.append(record.get("disturbed"))
            reasons.append(record.get("disturbed_reason"))
            bounds.append(None)
            continue
        actions = int(_number(record.get("attempted_actions")) or 0)
        shaped = str(record.get("backend")) != "none"
        stall = _number(record.get("stall_ms_per_action"))
        flagged, reason = judge(record, stall_ms_per_action=stall, actions=actions,
                                shaped=shaped)
        verdicts.append(flagged)
        reasons.append(reason)
        bound = bound_ms(record, actions=actions, shaped=shaped)
        bounds.append(100.0 * bound / stall if stall else None)
    frame["disturbed"] = verdicts
    frame["disturbed_reason"] = reasons
    frame["disturbance_bound_pct"] = bounds
    return frame


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
