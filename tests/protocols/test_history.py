"""The history format and the derivation-currency checker on hand-written histories."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocols.history import HistoryError, HostHistory, parse_history
from protocols.history_check import (
    CURRENT,
    STALE,
    STALE_IN_WINDOW,
    ActionVerdict,
    check_history,
    describe,
)


def text(host: str, *events: dict[str, Any]) -> str:
    lines = [{"history": 1, "host": host}, *events]
    return "".join(json.dumps(e) + "\n" for e in lines)


def write(t: int, key: str, version: str, owner: str) -> dict[str, Any]:
    return {"type": "write", "t_ns": t, "key": key, "version": version, "owner": owner}


def judge(*files: tuple[str, list[dict[str, Any]]]) -> dict[str, ActionVerdict]:
    histories = [parse_history(text(host, *events), f"{host}.jsonl") for host, events in files]
    return {v.action: v for v in check_history(histories).verdicts}


OWNER = ("own", [write(100, "k", "v1", "own"), write(300, "k", "v2", "own"),
                 write(400, "k", "v3", "own")])


def test_an_action_on_the_current_version_is_current() -> None:
    verdicts = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 310, "plan": "p", "inputs": {"k": "v2"}},
        {"type": "act", "t_ns": 350, "action": "a", "plan": "p"}]))
    assert verdicts["a"].status == CURRENT
    assert verdicts["a"].stale == ()


def test_a_write_at_the_same_instant_as_the_action_already_counts() -> None:
    verdicts = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "act", "t_ns": 300, "action": "a", "plan": "p"}]))
    assert verdicts["a"].status == STALE


def test_a_stale_action_is_explained_by_the_first_newer_write() -> None:
    verdicts = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "act", "t_ns": 450, "action": "a", "plan": "p"}]))
    verdict = verdicts["a"]
    assert verdict.status == STALE
    (why,) = verdict.stale
    assert (why.key, why.used, why.newer, why.newer_t_ns, why.newer_by, why.current) == \
        ("k", "v1", "v2", 300, "own", "v3")
    assert why.late_ns == 150
    assert verdict.late_ns == 150
    assert not verdict.fresh_memory_stale_plan  # ex never held v2 or v3
    line = describe(verdict)
    assert "superseded by v2 written by own" in line
    assert "current v3" in line


def test_fresh_memory_stale_plan_when_the_actor_already_held_a_newer_version() -> None:
    verdicts = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "install", "t_ns": 320, "key": "k", "version": "v2"},
        {"type": "act", "t_ns": 350, "action": "a", "plan": "p"},
        {"type": "derive", "t_ns": 360, "plan": "q", "inputs": {"k": "v1"}},
        {"type": "act", "t_ns": 450, "action": "b", "plan": "q"},
        {"type": "read", "t_ns": 500, "key": "k", "version": "v3"}]))
    assert verdicts["a"].fresh_memory_stale_plan
    assert "fresh memory, stale plan" in describe(verdicts["a"])
    assert verdicts["b"].fresh_memory_stale_plan  # v2 was held since 320
    # A version held only after the action does not count.
    late = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "act", "t_ns": 350, "action": "a", "plan": "p"},
        {"type": "install", "t_ns": 360, "key": "k", "version": "v2"}]))
    assert late["a"].status == STALE
    assert not late["a"].fresh_memory_stale_plan
    # The owner acting on its own superseded input holds the newer version it wrote.
    own = judge(("own", [write(100, "k", "v1", "own"),
                         {"type": "derive", "t_ns": 150, "plan": "p", "inputs": {"k": "v1"}},
                         write(300, "k", "v2", "own"),
                         {"type": "act", "t_ns": 350, "action": "a", "plan": "p"}]))
    assert own["a"].fresh_memory_stale_plan
    # A central store records the write; its writer ("ex", the owner field) holds it.
    central = judge(("store", [write(100, "k", "v1", "store"), write(300, "k", "v2", "ex")]),
                    ("ex", [{"type": "derive", "t_ns": 150, "plan": "p", "inputs": {"k": "v1"}},
                            {"type": "act", "t_ns": 350, "action": "a", "plan": "p"}]))
    assert central["a"].fresh_memory_stale_plan


def test_a_write_inside_the_validation_window_is_classified_apart() -> None:
    inside = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 150, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "check", "t_ns": 290, "start_t_ns": 250, "action": "a"},
        {"type": "act", "t_ns": 320, "action": "a", "plan": "p"}]))
    assert inside["a"].status == STALE_IN_WINDOW
    assert inside["a"].window == (250, 290)
    assert "validation window" in describe(inside["a"])
    # The write came before the check started: the check should have seen it.
    before = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 150, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "check", "t_ns": 340, "start_t_ns": 310, "action": "a"},
        {"type": "act", "t_ns": 350, "action": "a", "plan": "p"}]))
    assert before["a"].status == STALE
    # A check of another action opens no window for this one.
    other = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 150, "plan": "p", "inputs": {"k": "v1"}},
        {"type": "check", "t_ns": 290, "start_t_ns": 250, "action": "b"},
        {"type": "act", "t_ns": 320, "action": "a", "plan": "p"}]))
    assert other["a"].status == STALE
    assert other["a"].window is None


def test_one_input_superseded_before_the_check_makes_the_action_plainly_stale() -> None:
    verdicts = judge(("own", [write(100, "k", "v1", "own"), write(100, "j", "w1", "own"),
                              write(200, "j", "w2", "own"), write(300, "k", "v2", "own")]),
                     ("ex", [{"type": "derive", "t_ns": 150, "plan": "p",
                              "inputs": {"k": "v1", "j": "w1"}},
                             {"type": "check", "t_ns": 290, "start_t_ns": 250, "action": "a"},
                             {"type": "act", "t_ns": 320, "action": "a", "plan": "p"}]))
    verdict = verdicts["a"]
    assert verdict.status == STALE
    assert {s.key for s in verdict.stale} == {"j", "k"}
    assert verdict.headline is not None
    assert verdict.headline.key == "j"
    assert verdict.late_ns == 120


def test_a_declared_key_the_plan_did_not_read_is_stale() -> None:
    verdicts = judge(OWNER, ("ex", [
        {"type": "derive", "t_ns": 310, "plan": "p", "inputs": {"k": "v2"}},
        {"type": "act", "t_ns": 350, "action": "a", "plan": "p", "keys": ["k", "m"]}]))
    assert verdicts["a"].status == STALE
    assert [(s.key, s.used) for s in verdicts["a"].stale] == [("m", "")]
    assert "no input of 'm'" in describe(verdicts["a"])


@pytest.mark.parametrize(("events", "message"), [
    ([{"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v9"}}],
     "ex.jsonl:2: derived from version 'v9' of 'k', which no write in the history made"),
    ([{"type": "install", "t_ns": 200, "key": "k", "version": "v9"}],
     "ex.jsonl:2: install version 'v9'"),
    ([{"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v2"}}],
     "ex.jsonl:2: derived from version 'v2' of 'k' at t_ns 200, before it was written"),
    ([{"type": "act", "t_ns": 200, "action": "a", "plan": "nope"}],
     "ex.jsonl:2: act 'a' executes plan 'nope', which no derive made"),
    ([{"type": "derive", "t_ns": 200, "plan": "p", "inputs": {"k": "v1"}},
      {"type": "act", "t_ns": 210, "action": "a", "plan": "p"},
      {"type": "act", "t_ns": 220, "action": "a", "plan": "p"}],
     "ex.jsonl:4: action 'a' was already issued at ex.jsonl:3"),
    ([write(200, "k", "v1", "ex")], "ex.jsonl:2: version 'v1' of 'k' was already written"),
])
def test_histories_the_checker_cannot_judge_name_the_line(events: list[dict[str, Any]],
                                                         message: str) -> None:
    histories = [parse_history(text("own", *OWNER[1]), "own.jsonl"),
                 parse_history(text("ex", *events), "ex.jsonl")]
    with pytest.raises(HistoryError) as info:
        check_history(histories)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("body", "message"), [
    ('{"type": "act", "t_ns": 5, "action": "a", "plan": "p"}\n'
     '{"type": "write", "t_ns": 4, "key": "k", "version": "v", "owner": "h"}\n',
     "h.jsonl:3: t_ns 4 goes back in time"),
    ('{"type": "commit", "t_ns": 5}\n', "h.jsonl:2: unknown event type 'commit'; allowed:"),
    ('{"type": "write", "t_ns": 5, "key": "k", "version": "v"}\n',
     "h.jsonl:2: write: field owner must be a non-empty string"),
    ('{"type": "write", "t_ns": "5", "key": "k", "version": "v", "owner": "h"}\n',
     "h.jsonl:2: write: t_ns must be an integer"),
    ('{"type": "check", "t_ns": 5, "start_t_ns": 9, "action": "a"}\n',
     "h.jsonl:2: check: start_t_ns is after its end t_ns"),
    ('[1, 2]\n', "h.jsonl:2: expected a JSON object"),
    ('{"type": "act", "t_ns": 5, "act\n{"type": "act", "t_ns": 6, "action": "a", "plan": "p"}\n',
     "h.jsonl:2: not a JSON object"),
])
def test_bad_lines_are_one_line_errors_naming_the_line(body: str, message: str) -> None:
    with pytest.raises(HistoryError) as info:
        parse_history('{"history": 1, "host": "h"}\n' + body, "h.jsonl")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_the_header_is_required_and_versioned() -> None:
    with pytest.raises(HistoryError, match=r"^h.jsonl:1: the first line must be the header"):
        parse_history('{"type": "act", "t_ns": 1, "action": "a", "plan": "p"}\n', "h.jsonl")
    with pytest.raises(HistoryError, match=r"^h.jsonl:1: history version 2 is not supported"):
        parse_history('{"history": 2, "host": "h"}\n', "h.jsonl")


def test_a_truncated_last_line_is_reported_and_the_rest_is_kept() -> None:
    whole = text("own", *OWNER[1])
    cut = whole + '{"type": "write", "t_ns": 500, "ke'
    history = parse_history(cut, "own.jsonl")
    assert isinstance(history, HostHistory)
    assert [e.version for e in history.events] == ["v1", "v2", "v3"]
    assert history.truncated.startswith("own.jsonl:5: truncated mid-line")
    ex = parse_history(text("ex", {"type": "derive", "t_ns": 200, "plan": "p",
                                   "inputs": {"k": "v1"}},
                            {"type": "act", "t_ns": 450, "action": "a", "plan": "p"}), "ex")
    result = check_history([history, ex])
    assert result.truncated == (history.truncated,)
    assert result.verdicts[0].status == STALE
    assert not parse_history(whole, "own.jsonl").truncated


def test_free_form_fields_are_kept() -> None:
    history = parse_history(text("h", {"type": "act", "t_ns": 1, "action": "a", "plan": "p",
                                       "tool": "deploy", "keys": ["k"]}), "h.jsonl")
    (event,) = history.events
    assert event.extra == {"tool": "deploy"}
    assert event.keys == ("k",)
