"""The derivation-currency checker: every action of a history judged at its issue instant.

Rules (docs/history.md, "The checker"):

1. A key's versions are ordered by their ``write`` instants; the current version of a
   key at instant t is the last one written at or before t (the same instant counts).
2. An action is *current* if every declared input of the plan it executes is the
   current version of its key at the action's ``t_ns``; otherwise *stale*. A declared
   key the plan has no input for is stale (nothing shows the plan read it).
3. A stale input's explanation is minimal: the version used, the first version written
   after it (``newer``: when and by whom), the version current at the action, how long
   after that first newer write the action was issued (``late_ns``), and whether the
   acting host already held the newer version (or a later one) at the action: a
   ``write`` it made (its ``owner``) or recorded, a ``read`` or an ``install`` on it at
   or before the action. An action with such an input is "fresh memory, stale plan".
4. Validation window: the action's last ``check`` of the same action on the acting
   host that ended at or before it. A stale action whose every stale input was first
   superseded after that check started is ``stale_in_window`` (the write landed
   between the check and the issue); stale with any input superseded before the
   check, or with no check, is ``stale``.
5. A history the checker cannot judge is a :class:`HistoryError` naming the line: a
   version used, read or installed that no ``write`` made; a version used at an
   instant before it was written; an action whose plan no ``derive`` made; the same
   action, plan or version twice. A host may have several files (one per program):
   its events are their union.

Pure and single pass over sorted arrays: O(n log n) in the number of events.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from protocols.history import Event, HistoryError, HostHistory

CURRENT, STALE, STALE_IN_WINDOW = "current", "stale", "stale_in_window"


@dataclass(frozen=True)
class StaleInput:
    """Why one input made an action stale (rule 3). ``used`` is "" when the plan has no
    input for the key; then the newer fields describe the version current at the act."""

    key: str
    used: str
    newer: str
    newer_t_ns: int | None
    newer_by: str
    current: str
    late_ns: int | None
    held_newer: bool
    in_window: bool


@dataclass(frozen=True)
class ActionVerdict:
    action: str
    host: str
    plan: str
    t_ns: int
    status: str  # CURRENT, STALE or STALE_IN_WINDOW
    stale: tuple[StaleInput, ...] = ()
    #: (start, end) of the check that opened the action's validation window, if any.
    window: tuple[int, int] | None = None

    @property
    def fresh_memory_stale_plan(self) -> bool:
        return any(s.held_newer for s in self.stale)

    @property
    def late_ns(self) -> int | None:
        """The action's lateness: after the earliest superseding write of its inputs."""
        lates = [s.late_ns for s in self.stale if s.late_ns is not None]
        return max(lates) if lates else None

    @property
    def headline(self) -> StaleInput | None:
        """The input with the earliest superseding write (the minimal explanation)."""
        if not self.stale:
            return None
        return max(self.stale, key=lambda s: -1 if s.late_ns is None else s.late_ns)


@dataclass(frozen=True)
class CheckResult:
    verdicts: tuple[ActionVerdict, ...]
    #: Truncated tails of the files (each one line; their complete lines were judged).
    truncated: tuple[str, ...] = ()

    def count(self, status: str) -> int:
        return sum(1 for v in self.verdicts if v.status == status)

    @property
    def anomalies(self) -> tuple[ActionVerdict, ...]:
        return tuple(v for v in self.verdicts if v.status != CURRENT)


class _Versions:
    """One key's writes in time order (rule 1)."""

    def __init__(self, writes: list[Event]) -> None:
        writes.sort(key=lambda e: e.t_ns)
        self.times = [e.t_ns for e in writes]
        self.writes = writes
        self.index: dict[str, int] = {}
        for i, event in enumerate(writes):
            if event.version in self.index:
                first = writes[self.index[event.version]]
                raise HistoryError(f"{event.where}: version {event.version!r} of "
                                   f"{event.key!r} was already written at {first.where}")
            self.index[event.version] = i

    def current_at(self, t_ns: int) -> int:
        return bisect.bisect_right(self.times, t_ns) - 1


class _Holdings:
    """What one host held of one key over time: the prefix maximum of version indices."""

    def __init__(self, entries: list[tuple[int, int]]) -> None:
        entries.sort()
        self.times = [t for t, _ in entries]
        self.best: list[int] = []
        best = -1
        for _, index in entries:
            best = max(best, index)
            self.best.append(best)

    def newest_at(self, t_ns: int) -> int:
        i = bisect.bisect_right(self.times, t_ns) - 1
        return self.best[i] if i >= 0 else -1


def _version_of(versions: dict[str, _Versions], event: Event, key: str, version: str,
                what: str) -> int:
    known = versions.get(key)
    if known is None or version not in known.index:
        raise HistoryError(f"{event.where}: {what} version {version!r} of {key!r}, which "
                           f"no write in the history made")
    index = known.index[version]
    if known.times[index] > event.t_ns:
        raise HistoryError(f"{event.where}: {what} version {version!r} of {key!r} at "
                           f"t_ns {event.t_ns}, before it was written "
                           f"({known.writes[index].where})")
    return index


def check_history(histories: Sequence[HostHistory]) -> CheckResult:
    """Judge every ``act`` of the hosts' histories (module rules)."""
    events = [e for h in histories for e in h.events]
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.type == "write":
            by_key[e.key].append(e)
    versions = {key: _Versions(writes) for key, writes in by_key.items()}

    plans: dict[str, Event] = {}
    held: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    checks: dict[tuple[str, str], list[Event]] = defaultdict(list)
    acts: list[Event] = []
    for e in events:
        if e.type == "derive":
            if e.plan in plans:
                raise HistoryError(f"{e.where}: plan {e.plan!r} was already derived at "
                                   f"{plans[e.plan].where}")
            for key, version in e.inputs.items():
                _version_of(versions, e, key, version, "derived from")
            plans[e.plan] = e
        elif e.type == "write":  # its writer holds it, and the host that recorded it
            index = versions[e.key].index[e.version]
            for holder in {e.owner, e.host}:
                held[(holder, e.key)].append((e.t_ns, index))
        elif e.type in ("read", "install"):
            index = _version_of(versions, e, e.key, e.version, e.type)
            held[(e.host, e.key)].append((e.t_ns, index))
        elif e.type == "check":
            checks[(e.host, e.action)].append(e)
        elif e.type == "act":
            acts.append(e)
    holdings = {hk: _Holdings(entries) for hk, entries in held.items()}

    seen: dict[str, Event] = {}
    verdicts = []
    for act in sorted(acts, key=lambda e: e.t_ns):
        if act.action in seen:
            raise HistoryError(f"{act.where}: action {act.action!r} was already issued at "
                               f"{seen[act.action].where}")
        seen[act.action] = act
        derive = plans.get(act.plan)
        if derive is None:
            raise HistoryError(f"{act.where}: act {act.action!r} executes plan "
                               f"{act.plan!r}, which no derive made")
        verdicts.append(_judge(act, derive, versions, holdings, checks))
    truncated = tuple(h.truncated for h in histories if h.truncated)
    return CheckResult(tuple(verdicts), truncated)


def _last_check(checks: dict[tuple[str, str], list[Event]], act: Event) -> Event | None:
    before = [c for c in checks.get((act.host, act.action), ()) if c.t_ns <= act.t_ns]
    return before[-1] if before else None


def _judge(act: Event, derive: Event, versions: dict[str, _Versions],
           holdings: dict[tuple[str, str], _Holdings],
           checks: dict[tuple[str, str], list[Event]]) -> ActionVerdict:
    check = _last_check(checks, act)
    window = None if check is None else (check.start_t_ns, check.t_ns)
    keys = act.keys if act.keys is not None else tuple(sorted(derive.inputs))
    stale: list[StaleInput] = []
    for key in keys:
        known = versions.get(key)
        current = -1 if known is None else known.current_at(act.t_ns)
        used = derive.inputs.get(key)
        if used is None:
            write = None if known is None or current < 0 else known.writes[current]
            stale.append(StaleInput(
                key, "", "" if write is None else write.version,
                None if write is None else write.t_ns, "" if write is None else write.owner,
                "" if write is None else write.version, None, False, False))
            continue
        assert known is not None  # derive inputs were checked against the writes
        index = _version_of(versions, act, key, used, "acts on")
        if index == current:
            continue
        newer = known.writes[index + 1]
        have = holdings.get((act.host, key))
        held_newer = have is not None and have.newest_at(act.t_ns) > index
        in_window = check is not None and newer.t_ns > check.start_t_ns
        stale.append(StaleInput(key, used, newer.version, newer.t_ns, newer.owner,
                                known.writes[current].version, act.t_ns - newer.t_ns,
                                held_newer, in_window))
    if not stale:
        status = CURRENT
    elif all(s.in_window for s in stale):
        status = STALE_IN_WINDOW
    else:
        status = STALE
    return ActionVerdict(act.action, act.host, act.plan, act.t_ns, status, tuple(stale),
                         window)


def describe(verdict: ActionVerdict, t0_ns: int = 0) -> str:
    """One line for a non-current action (times in ms after ``t0_ns``)."""
    def ms(t: int | None) -> str:
        return "?" if t is None else f"{(t - t0_ns) / 1e6:.3f} ms"

    head = verdict.headline
    line = (f"{verdict.status} action {verdict.action!r} by {verdict.host} at "
            f"{ms(verdict.t_ns)} (plan {verdict.plan[:12]})")
    if head is None:
        return line
    if not head.used:
        line += f": the plan has no input of {head.key!r}"
    else:
        assert head.late_ns is not None
        line += (f": input {head.key!r} used {head.used[:12]}, superseded by "
                 f"{head.newer[:12]} written by {head.newer_by} at {ms(head.newer_t_ns)}, "
                 f"late {head.late_ns / 1e6:.3f} ms")
        if head.current != head.newer:
            line += f" (current {head.current[:12]})"
    if len(verdict.stale) > 1:
        line += f"; {len(verdict.stale) - 1} more stale input(s)"
    if verdict.fresh_memory_stale_plan:
        line += f"; {verdict.host} already held the newer version (fresh memory, stale plan)"
    if verdict.window is not None and verdict.status == STALE_IN_WINDOW:
        line += (f"; the write landed in the validation window from "
                 f"{ms(verdict.window[0])}")
    return line
