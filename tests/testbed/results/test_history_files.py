"""Histories in a run directory and ``testbed history check`` over them (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.results.history import (
    check_episode,
    episode_folders,
    history_columns,
    history_texts,
    write_history,
)

EPISODE = "p_loopback/reservation-01"
MS = 1_000_000  # ns
WRITES = [{"type": "write", "t_ns": 100 * MS, "key": "k", "version": "v1", "owner": "a0"},
          {"type": "write", "t_ns": 300 * MS, "key": "k", "version": "v2", "owner": "a0"}]


def _run(tmp_path: Path, acts: list[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    write_history(run, EPISODE, history_texts({"a0": WRITES, "a1": acts}))
    return run


def _stale_and_current() -> list[dict[str, Any]]:
    return [{"type": "derive", "t_ns": 150 * MS, "plan": "p1", "inputs": {"k": "v1"}},
            {"type": "install", "t_ns": 320 * MS, "key": "k", "version": "v2"},
            {"type": "act", "t_ns": 350 * MS, "action": "stale", "plan": "p1"},
            {"type": "derive", "t_ns": 360 * MS, "plan": "p2", "inputs": {"k": "v2"}},
            {"type": "act", "t_ns": 370 * MS, "action": "fine", "plan": "p2"}]


def test_check_names_each_stale_action_and_writes_the_anomalies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, _stale_and_current())
    assert (run / "history" / "p_loopback~reservation-01" / "a1.jsonl").is_file()
    assert main(["history", "check", str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{EPISODE}: stale action 'stale' by a1 at 250.000 ms")
    assert "fresh memory, stale plan" in lines[0]
    assert lines[1] == ("2 action(s) in 1 episode(s): 1 current, 1 stale (0 in a validation "
                        "window, 1 fresh memory with a stale plan)")
    (record,) = [json.loads(x) for x in
                 (run / "history" / "anomalies.jsonl").read_text().splitlines()]
    assert record["episode"] == EPISODE
    assert record["inputs"][0]["late_ns"] == 50 * MS
    # One episode's folder works too.
    assert main(["history", "check", "--quiet",
                 str(run / "history" / "p_loopback~reservation-01")]) == 1


def test_a_run_of_current_actions_exits_0(tmp_path: Path) -> None:
    run = _run(tmp_path, _stale_and_current()[3:])
    assert main(["history", "check", "--quiet", str(run)]) == 0


def test_a_bad_history_is_one_line_naming_the_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, [{"type": "derive", "t_ns": 150 * MS, "plan": "p1",
                           "inputs": {"k": "v7"}}])
    assert main(["history", "check", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == ("testbed history: run/history/p_loopback~reservation-01/a1.jsonl:2: "
                   "derived from version 'v7' of 'k', which no write in the history made\n")
    assert main(["history", "check", str(tmp_path / "nothing")]) == 2


def test_a_truncated_file_is_reported_and_the_rest_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, _stale_and_current())
    path = run / "history" / "p_loopback~reservation-01" / "a1.jsonl"
    path.write_text(path.read_text() + '{"type": "act", "t_ns": 4 * MS')
    assert main(["history", "check", str(run)]) == 1
    out = capsys.readouterr().out
    assert "a1.jsonl:7: truncated mid-line; the 5 events before it were kept" in out
    assert "1 stale" in out.splitlines()[-1]


def test_episode_columns_count_the_verdicts() -> None:
    columns = history_columns(check_episode(history_texts(
        {"a0": WRITES, "a1": _stale_and_current()})))
    assert columns == {"stale_actions": 1, "stale_in_window_actions": 0,
                       "fresh_memory_stale_plan": 1, "stale_late_p50_ms": 50.0,
                       "stale_late_max_ms": 50.0}
    none = history_columns(check_episode(history_texts({"a0": WRITES})))
    assert none["stale_actions"] == 0
    assert none["stale_late_p50_ms"] is None


def test_a_later_attempt_keeps_the_first_attempts_history(tmp_path: Path) -> None:
    run = _run(tmp_path, _stale_and_current())
    write_history(run, EPISODE, history_texts({"a0": WRITES}), attempt=2)
    assert [key for key, _ in episode_folders(run)] == [EPISODE, f"{EPISODE}@2"]
    assert (run / "history" / "p_loopback~reservation-01" / "a1.jsonl").is_file()
