"""What an episode's timeline shows, before any drawing: lanes, marks, arrows, highlights.

Rules (docs/reports.md, "Timeline of one episode"):

1. One lane per host: the hosts of the history files, then any peer only ``rpc`` events
   name, each in name order. Times are milliseconds after the header's ``t0_ns`` when
   every file has the same one, else after the episode's first event.
2. Marks: every ``write``, ``derive`` and ``act`` at its host and instant; every
   ``check`` as a span from its ``start_t_ns`` to its ``t_ns``. Installs and reads are
   not drawn (they would hide the rest).
3. Arrows come only from recorded messages: an ``rpc`` event with ``served_t_ns`` is a
   request (caller at ``start_t_ns`` to peer at ``served_t_ns``) and a reply (peer at
   ``served_t_ns`` to caller at ``t_ns``). An ``rpc`` without the peer's instant is
   counted, not drawn; a history with no ``rpc`` events has no arrows, and says so.
4. Every action the checker did not find current is highlighted with, for each stale
   input, the write that superseded the version it used (``newer``: the first version
   written after it), found by key and version among the history's writes.

Pure: histories and the checker's result in, a :class:`Timeline` out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocols.history import Event, HostHistory
from protocols.history_check import CURRENT, CheckResult


@dataclass(frozen=True)
class Mark:
    kind: str  # write, derive, check, act
    host: str
    t_ms: float
    label: str
    end_ms: float | None = None  # a check's end (its span); None for an instant


@dataclass(frozen=True)
class Arrow:
    kind: str  # request or reply
    method: str
    src: str
    src_ms: float
    dst: str
    dst_ms: float


@dataclass(frozen=True)
class Highlight:
    """A non-current action and the writes that superseded what its plan used."""

    action: str
    status: str
    act: Mark
    superseding: tuple[Mark, ...]
    fresh_memory_stale_plan: bool


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[str, ...]
    marks: tuple[Mark, ...]
    arrows: tuple[Arrow, ...]
    highlights: tuple[Highlight, ...]
    #: rpc events in the history (0: the run recorded no messages; rule 3)
    rpc_events: int
    #: of those, calls without the peer's instant (not drawn)
    undrawn_rpcs: int

    @property
    def has_messages(self) -> bool:
        return self.rpc_events > 0


def _origin(histories: Sequence[HostHistory]) -> int:
    t0s = {h.t0_ns for h in histories}
    if len(t0s) == 1 and None not in t0s:
        t0 = t0s.pop()
        assert t0 is not None
        return t0
    firsts = [min(e.start_t_ns if e.type in ("check", "rpc") else e.t_ns for e in h.events)
              for h in histories if h.events]
    return min(firsts) if firsts else 0


def _short(name: str) -> str:
    return name[:8]


def _mark(e: Event, ms: float) -> Mark:
    if e.type == "write":
        return Mark("write", e.host, ms, f"{e.key}@{_short(e.version)}")
    if e.type == "derive":
        return Mark("derive", e.host, ms, _short(e.plan))
    return Mark("act", e.host, ms, e.action)


def timeline_layout(histories: Sequence[HostHistory], result: CheckResult) -> Timeline:
    """The timeline of one episode (module rules)."""
    t0 = _origin(histories)

    def ms(t_ns: int) -> float:
        return (t_ns - t0) / 1e6

    hosts = sorted({h.host for h in histories})
    peers: set[str] = set()
    marks: list[Mark] = []
    arrows: list[Arrow] = []
    writes: dict[tuple[str, str], Mark] = {}
    acts: dict[str, Mark] = {}
    rpcs = undrawn = 0
    for e in sorted((e for h in histories for e in h.events), key=lambda e: e.t_ns):
        if e.type in ("write", "derive", "act"):
            mark = _mark(e, ms(e.t_ns))
            marks.append(mark)
            if e.type == "write":
                writes[(e.key, e.version)] = mark
            elif e.type == "act":
                acts[e.action] = mark
        elif e.type == "check":
            marks.append(Mark("check", e.host, ms(e.start_t_ns), e.action, ms(e.t_ns)))
        elif e.type == "rpc":
            rpcs += 1
            peers.add(e.peer)
            served = e.extra.get("served_t_ns")
            if not isinstance(served, int) or isinstance(served, bool):
                undrawn += 1
                continue
            arrows.append(Arrow("request", e.method, e.host, ms(e.start_t_ns), e.peer,
                                ms(served)))
            arrows.append(Arrow("reply", e.method, e.peer, ms(served), e.host, ms(e.t_ns)))
    highlights = []
    for verdict in result.verdicts:
        if verdict.status == CURRENT or verdict.action not in acts:
            continue
        superseding = tuple(writes[(s.key, s.newer)] for s in verdict.stale
                            if (s.key, s.newer) in writes)
        highlights.append(Highlight(verdict.action, verdict.status, acts[verdict.action],
                                    superseding, verdict.fresh_memory_stale_plan))
    lanes = (*hosts, *sorted(peers - set(hosts)))
    return Timeline(lanes, tuple(marks), tuple(arrows), tuple(highlights), rpcs, undrawn)
