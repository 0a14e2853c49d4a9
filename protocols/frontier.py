"""The dependency frontier of a plan and the release predicate (Algorithm 1, lines 2-14).

Three views of every declared key ``x`` of an action (paper, section 3):
``F(x)`` the input version the plan was derived from (recovered from parent links),
``C(x)`` the newest local version captured when a validation pass starts, ``H(x)``
the owner's current head. Release only when all three agree for every declared key.

Rules this module follows:

1. Pure: no I/O, no clock. Records come from a ``get_record`` callable (the local
   store); heads are plain mappings.
2. Traversal (appendix E.3): worklist from the distinct roots, a visited set so each
   record is expanded once; a record of a declared key joins that key's boundary set
   and is not expanded; any other record adds its exact parents; the worklist is
   drained even after every key has a version, since another branch may conflict.
3. A record missing before or at a boundary blocks. Records behind a reached
   boundary are never read, so they need not exist.
4. An empty boundary set (a key not covered) or one with several IDs (ambiguous
   version) blocks. Blocking is reported as :class:`EvidenceError` with a reason.
5. A frontier depends only on the roots, the declared keys and the immutable records
   it read: installing more records or advancing heads never changes a defined one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from protocols.env import LocalStore
from protocols.errors import ProtocolError
from protocols.identity import Roster
from protocols.records import HeadInfo, Record


class EvidenceError(ProtocolError):
    """Validation evidence is missing or conflicting: the action must block.

    Nobody misused an API; the evidence needed to prove derivation currency is not
    there (a record is absent, a key is not covered, a boundary is ambiguous).
    """


GetRecord = Callable[[bytes], Record | None]


@dataclass(frozen=True)
class Frontier:
    """A defined frontier: ``inputs[x]`` is the unique boundary ID F(x) per declared key."""

    inputs: dict[str, bytes]
    #: Every record ID the traversal read (roots included); for diagnostics and tests.
    visited: frozenset[bytes] = field(default_factory=frozenset)


def capture(store: LocalStore, declared: Iterable[str], roster: Roster) -> dict[str, bytes]:
    """The wrapper's capture of C(x): the newest local version of each declared key.

    A missing owner mapping, a missing local input, or a local record not authored by
    the key's declared owner raises :class:`EvidenceError`.
    """
    captured: dict[str, bytes] = {}
    for key in declared:
        owner = roster.owners.get(key)
        if owner is None:
            raise EvidenceError(f"declared key {key!r} has no owner in the roster")
        head = store.latest(key)
        if head is None:
            raise EvidenceError(f"no local version of declared key {key!r}")
        record = store.get(head.record_id)
        if record is None or record.id != head.record_id:
            raise EvidenceError(f"local version of {key!r} is not readable")
        if record.author != owner or record.owner != owner:
            raise EvidenceError(f"local version of {key!r} was written by "
                                f"{record.author!r}, not its owner {owner!r}")
        captured[key] = head.record_id
    return captured


def reconstruct(get_record: GetRecord, roots: Iterable[bytes],
                declared: Iterable[str]) -> Frontier:
    """Algorithm 1 lines 2-14: the plan's recorded input per declared key, or a block."""
    keys = set(declared)
    queue = list(dict.fromkeys(roots))  # distinct roots, order kept
    if not queue:
        raise EvidenceError("the action names no plan roots")
    if not keys:
        raise EvidenceError("the action declares no dependency keys")
    visited: set[bytes] = set()
    boundary: dict[str, set[bytes]] = {k: set() for k in keys}
    while queue:
        rid = queue.pop()
        if rid in visited:
            continue
        record = get_record(rid)
        if record is None:
            raise EvidenceError(f"record {rid.hex()[:12]} on the plan's ancestry is missing")
        if record.id != rid:
            raise EvidenceError(f"record {rid.hex()[:12]} does not match its ID")
        visited.add(rid)
        if record.key in keys:
            boundary[record.key].add(rid)
        else:
            queue.extend(record.parents)
    inputs: dict[str, bytes] = {}
    for key in sorted(keys):
        found = boundary[key]
        if not found:
            raise EvidenceError(f"declared key {key!r} is not reached by the plan's ancestry")
        if len(found) > 1:
            raise EvidenceError(f"declared key {key!r} has {len(found)} different "
                                f"recorded versions")
        (inputs[key],) = found
    return Frontier(inputs, frozenset(visited))


def release_ok(frontier: Mapping[str, bytes], captured: Mapping[str, bytes],
               heads: Mapping[str, bytes]) -> bool:
    """The release predicate F = C = H for every declared key (keys of ``frontier``)."""
    return bool(frontier) and all(
        key in captured and key in heads and fid == captured[key] == heads[key]
        for key, fid in frontier.items())


class Verdict(enum.Enum):
    RELEASE = "release"
    REPLAN = "replan"
    BLOCK = "block"


@dataclass(frozen=True)
class Decision:
    """Lines 19-22 of Algorithm 1: what to do after heads were obtained and refreshed."""

    verdict: Verdict
    #: The owner-reported IDs to replan from (set when ``verdict`` is REPLAN).
    heads: dict[str, bytes] = field(default_factory=dict)
    reason: str = ""


def decide(frontier: Mapping[str, bytes], captured: Mapping[str, bytes],
           heads: Mapping[str, bytes], *, replanned: bool) -> Decision:
    """Release, ask for the single replan (with H), or block once the budget is spent."""
    missing = sorted(k for k in frontier if k not in heads or k not in captured)
    if missing:
        return Decision(Verdict.BLOCK, reason=f"evidence: no head for {', '.join(missing)}")
    if release_ok(frontier, captured, heads):
        return Decision(Verdict.RELEASE)
    stale = sorted(k for k in frontier
                   if not frontier[k] == captured[k] == heads[k])
    if replanned:
        return Decision(Verdict.BLOCK,
                        reason=f"stale after replan: {', '.join(stale)} changed again")
    return Decision(Verdict.REPLAN, heads={k: heads[k] for k in frontier})


def changed(captured: Mapping[str, bytes], heads: Mapping[str, HeadInfo]) -> list[HeadInfo]:
    """Heads whose ID differs from the captured local version (to fetch and install)."""
    return [h for k, h in sorted(heads.items()) if captured.get(k) != h.record_id]
