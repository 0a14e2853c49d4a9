"""The dependency frontier (Algorithm 1 lines 2-14), capture of C, and the decision rule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.frontier import (
    Decision,
    EvidenceError,
    Verdict,
    capture,
    changed,
    decide,
    reconstruct,
    release_ok,
)
from protocols.identity import Identity, Member, Roster
from protocols.records import Record, make_record
from tests.protocols.memory_env import MemoryStore

OWNER = Identity.derive("a0", 1)
PLANNER = Identity.derive("a1", 1)
ROSTER = Roster.build(
    [Member(i.agent_id, i.public_key, "127.0.0.1", 0) for i in (OWNER, PLANNER)],
    {"x": "a0", "y": "a0", "z": "a0"}, ["a0", "a1"])


def rec(key: str, seq: int, *parents: Record, who: Identity = OWNER,
        content: bytes = b"") -> Record:
    return make_record(who, key=key, owner=who.agent_id, seq=seq,
                       parents=[p.id for p in parents], rtype="requirement",
                       content=content or f"{key}{seq}".encode())


def derived(key: str, *parents: Record) -> Record:
    return rec(key, 0, *parents, who=PLANNER)


def getter(*records: Record) -> dict[bytes, Record]:
    return {r.id: r for r in records}


def test_direct_parent() -> None:
    r3 = rec("x", 3)
    p = derived("plan/a", r3)
    f = reconstruct(getter(r3, p).get, [p.id], ["x"])
    assert f.inputs == {"x": r3.id}


def test_multi_hop_stops_at_first_declared_key() -> None:
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)  # revision history behind r4
    v = derived("review/a", r3)
    p = derived("plan/a", v)
    assert reconstruct(getter(r3, v, p).get, [p.id], ["x"]).inputs == {"x": r3.id}
    p4 = derived("plan/b", r4)
    f4 = reconstruct(getter(r3, r4, p4).get, [p4.id], ["x"])
    assert f4.inputs == {"x": r4.id}
    assert r3.id not in f4.visited  # not expanded past the boundary


def test_several_roots() -> None:
    rx, ry = rec("x", 1), rec("y", 2)
    p1, p2 = derived("plan/a", rx), derived("plan/b", ry)
    f = reconstruct(getter(rx, ry, p1, p2).get, [p1.id, p2.id, p1.id], ["x", "y"])
    assert f.inputs == {"x": rx.id, "y": ry.id}


def test_declared_key_root_is_its_own_boundary() -> None:
    r = rec("x", 2)
    assert reconstruct(getter(r).get, [r.id], ["x"]).inputs == {"x": r.id}


def test_diamond_reaching_one_id_twice_is_no_conflict() -> None:
    r3 = rec("x", 3)
    v1, v2 = derived("review/a", r3), derived("review/b", r3)
    p = derived("plan/a", v1, v2)
    f = reconstruct(getter(r3, v1, v2, p).get, [p.id], ["x"])
    assert f.inputs == {"x": r3.id}


def test_two_branches_reaching_different_versions_block() -> None:
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)
    v1, v2 = derived("review/a", r3), derived("review/b", r4)
    p = derived("plan/a", v1, v2)
    with pytest.raises(EvidenceError, match="2 different"):
        reconstruct(getter(r3, r4, v1, v2, p).get, [p.id], ["x"])


def test_conflict_found_after_every_key_already_has_a_version() -> None:
    # Whichever branch is popped first, the traversal must drain the worklist.
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)
    for order in ([r3, r4], [r4, r3]):
        p = derived("plan/a", *order)
        with pytest.raises(EvidenceError):
            reconstruct(getter(r3, r4, p).get, [p.id], ["x"])


def test_missing_ancestor_before_boundary_blocks() -> None:
    r3 = rec("x", 3)
    v = derived("review/a", r3)
    p = derived("plan/a", v)
    with pytest.raises(EvidenceError, match="missing"):
        reconstruct(getter(r3, p).get, [p.id], ["x"])


def test_missing_boundary_record_blocks() -> None:
    r3 = rec("x", 3)
    p = derived("plan/a", r3)
    with pytest.raises(EvidenceError, match="missing"):
        reconstruct(getter(p).get, [p.id], ["x"])


def test_absent_record_behind_boundary_is_fine() -> None:
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)
    p = derived("plan/a", r4)
    assert reconstruct(getter(r4, p).get, [p.id], ["x"]).inputs == {"x": r4.id}


def test_key_only_behind_another_declared_key_is_not_covered() -> None:
    ry = rec("y", 1)
    rx = rec("x", 1, ry)  # y lies only behind the declared boundary x
    p = derived("plan/a", rx)
    with pytest.raises(EvidenceError, match="'y' is not reached"):
        reconstruct(getter(ry, rx, p).get, [p.id], ["x", "y"])
    # ...unless another branch reaches it
    p2 = derived("plan/b", rx, ry)
    f = reconstruct(getter(ry, rx, p2).get, [p2.id], ["x", "y"])
    assert f.inputs == {"x": rx.id, "y": ry.id}


def test_no_roots_or_no_keys_block() -> None:
    with pytest.raises(EvidenceError):
        reconstruct(getter().get, [], ["x"])
    r = rec("x", 1)
    with pytest.raises(EvidenceError):
        reconstruct(getter(r).get, [r.id], [])


def test_record_not_matching_its_id_blocks() -> None:
    r3, other = rec("x", 3), rec("x", 9)
    p = derived("plan/a", r3)
    with pytest.raises(EvidenceError, match="does not match"):
        reconstruct({p.id: p, r3.id: other}.get, [p.id], ["x"])


# --- capture ------------------------------------------------------------------------------

def test_capture_takes_latest_local_version() -> None:
    store = MemoryStore("a1", ROSTER)
    r1 = rec("x", 1)
    r2 = rec("x", 2, r1)
    store.install(r2)
    store.install(r1)
    assert capture(store, ["x"], ROSTER) == {"x": r2.id}


def test_capture_rejects_missing_input_and_unknown_owner() -> None:
    store = MemoryStore("a1", ROSTER)
    with pytest.raises(EvidenceError, match="no local version"):
        capture(store, ["x"], ROSTER)
    with pytest.raises(EvidenceError, match="no owner"):
        capture(store, ["unowned"], ROSTER)


def test_capture_rejects_input_not_written_by_its_owner() -> None:
    forged = rec("x", 5, who=PLANNER)  # a1 signs a version of a0's key

    class Unchecked:  # a store that failed to enforce the owner rule
        def latest(self, key: str) -> object:
            return forged.head if key == "x" else None

        def get(self, rid: bytes) -> Record | None:
            return forged if rid == forged.id else None

    with pytest.raises(EvidenceError, match="not its owner"):
        capture(Unchecked(), ["x"], ROSTER)  # type: ignore[arg-type]


# --- predicate and decision ------------------------------------------------------------------

def test_release_ok_needs_all_three_views_to_agree() -> None:
    a, b = b"a" * 32, b"b" * 32
    assert release_ok({"x": a}, {"x": a}, {"x": a})
    assert not release_ok({"x": a}, {"x": b}, {"x": b})  # stale plan
    assert not release_ok({"x": b}, {"x": a}, {"x": b})  # stale local copy
    assert not release_ok({"x": a}, {"x": a}, {})
    assert not release_ok({}, {}, {})


def test_decide_release_replan_block() -> None:
    a, b = b"a" * 32, b"b" * 32
    assert decide({"x": a}, {"x": a}, {"x": a}, replanned=False).verdict is Verdict.RELEASE
    d = decide({"x": a}, {"x": b}, {"x": b}, replanned=False)
    assert d == Decision(Verdict.REPLAN, heads={"x": b})
    assert decide({"x": a}, {"x": b}, {"x": b}, replanned=True).verdict is Verdict.BLOCK
    assert decide({"x": a}, {"x": a}, {"x": a}, replanned=True).verdict is Verdict.RELEASE
    missing = decide({"x": a}, {"x": a}, {}, replanned=False)
    assert missing.verdict is Verdict.BLOCK
    assert "no head" in missing.reason


def test_appendix_b_observation_current_but_not_derivation_current() -> None:
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)
    p3 = derived("plan/a", r3)
    store = MemoryStore("a1", ROSTER)
    for r in (r3, p3, r4):
        store.install(r)
    c = capture(store, ["x"], ROSTER)
    f = reconstruct(store.get, [p3.id], ["x"]).inputs
    h = {"x": r4.id}
    assert c == h  # observation-current
    assert f != h  # not derivation-current
    d = decide(f, c, h, replanned=False)
    assert d.verdict is Verdict.REPLAN
    assert d.heads == h
    assert changed(c, {"x": r4.head}) == []  # current content already held: no fetch


def test_appendix_b_derivation_current_but_not_observation_current() -> None:
    r3 = rec("x", 3)
    r4 = rec("x", 4, r3)
    p4 = derived("plan/a", r4)
    store = MemoryStore("a1", ROSTER)
    for r in (r3, p4):
        store.install(r)
    c = capture(store, ["x"], ROSTER)  # captured before r4 arrives
    with pytest.raises(EvidenceError):  # ancestry not yet available: blocks
        reconstruct(store.get, [p4.id], ["x"])
    store.install(r4)  # arrives before traversal; C stays as captured
    f = reconstruct(store.get, [p4.id], ["x"]).inputs
    h = {"x": r4.id}
    assert f == h
    assert c != h
    d = decide(f, c, h, replanned=False)
    assert d.verdict is Verdict.REPLAN  # conservative: C != H asks for a replacement
    assert decide(f, c, h, replanned=True).verdict is Verdict.BLOCK


# --- property: a defined frontier never changes ------------------------------------------------

KEYS = ["x", "y", "n1", "n2"]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Record], list[bytes], list[str], set[int],
                                        list[Record]]:
    """Records (each with parents among earlier ones), roots, declared keys, the indices
    initially absent from the store, and records installed later."""
    n = draw(st.integers(2, 12))
    seqs = dict.fromkeys(KEYS, 0)
    records: list[Record] = []
    for _ in range(n):
        key = draw(st.sampled_from(KEYS))
        parents = draw(st.lists(st.sampled_from(records), max_size=3, unique_by=lambda r: r.id)
                       ) if records else []
        seqs[key] += 1
        records.append(rec(key, seqs[key], *parents))
    roots = draw(st.lists(st.sampled_from(records), min_size=1, max_size=3))
    declared = draw(st.lists(st.sampled_from(["x", "y"]), min_size=1, unique=True))
    absent = set(draw(st.lists(st.integers(0, n - 1), max_size=n)))
    later: list[Record] = []
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.sampled_from(KEYS))
        parents = draw(st.lists(st.sampled_from(records + later), max_size=3,
                                unique_by=lambda r: r.id))
        seqs[key] += 1
        later.append(rec(key, seqs[key], *parents))
    return records, [r.id for r in roots], declared, absent, later


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_installing_records_and_advancing_heads_never_changes_a_defined_frontier(
        case: tuple[list[Record], list[bytes], list[str], set[int], list[Record]]) -> None:
    records, roots, declared, absent, later = case
    store = MemoryStore("a0", ROSTER)  # a0 owns x and y: installs advance its heads
    for i, r in enumerate(records):
        if i not in absent:
            store.install(r)
    try:
        before = reconstruct(store.get, roots, declared)
    except EvidenceError:
        return  # undefined: nothing to preserve
    heads_before = dict(store.heads)
    for i in sorted(absent):
        store.install(records[i])
    for r in later:
        store.install(r)
    after = reconstruct(store.get, roots, declared)
    assert after == before
    assert set(after.inputs.values()) <= set(before.visited)
    if later:  # heads did move for some histories; the frontier did not
        assert store.heads != heads_before or all(r.key not in ("x", "y") for r in later)
