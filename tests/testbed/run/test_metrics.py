"""The metrics protocol of command workloads (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.run.metrics import MetricsError, read_metrics


def write(path: Path, *lines: object, tail: str = "") -> Path:
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n"
                            for x in lines) + tail)
    return path


def test_actions_and_episode_fields(tmp_path: Path) -> None:
    a = write(tmp_path / "a0.metrics.jsonl",
              {"event": "action", "action": "act001", "ok": True, "stall_ms": 12.5,
               "bytes": 300, "t_ns": 2_000_000, "retries": 1, "server": "s"},
              "",
              {"event": "action", "ok": False, "reason": "stale"},
              {"event": "episode", "requests": 9},
              tail='{"event": "action", "ok": tr')  # stopped while writing: ignored
    actions, episode = read_metrics({"a0": ("a0", a)}, t0_ns=1_000_000)
    assert [r["action"] for r in actions] == ["act001", "a0/2"]
    first, second = actions
    assert (first["outcome"], first["ok"], first["stall_ms"], first["bytes"]) == (
        "ok", True, 12.5, 300)
    assert first["t_ms"] == 1.0
    assert first["host"] == "a0"
    assert json.loads(first["metrics"]) == {"retries": 1, "server": "s"}
    assert (second["outcome"], second["block_reason"], second["stall_ms"]) == (
        "failed", "stale", None)
    assert episode == {"a0": {"requests": 9}}


def test_no_file_means_nothing_reported(tmp_path: Path) -> None:
    assert read_metrics({"a0": ("a0", tmp_path / "none")}, t0_ns=None) == ([], {})


@pytest.mark.parametrize(("line", "message"), [
    ("not json", r"x.jsonl:1: not JSON"),
    ("[1, 2]", r"x.jsonl:1: expected a JSON object"),
    ('{"event": "metric"}', r"event 'metric' is not allowed; allowed: action, episode"),
    ('{"event": "action"}', r"ok: None is not allowed; allowed: true or false"),
    ('{"event": "action", "ok": 1}', r"ok: 1 is not allowed"),
    ('{"event": "action", "ok": true, "stall_ms": -1}', r"stall_ms: -1 is not allowed"),
    ('{"event": "action", "ok": true, "bytes": 1.5}', r"bytes: 1.5 is not allowed"),
    ('{"event": "action", "ok": true, "t_ns": "now"}', r"t_ns: 'now' is not allowed"),
    ('{"event": "action", "ok": true, "x": [1]}', r"field 'x': \[1\] is not allowed"),
    ('{"event": "action", "ok": true, "action": ""}', r"action: '' is not allowed"),
])
def test_protocol_faults_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "x.jsonl", line)
    with pytest.raises(MetricsError, match=message):
        read_metrics({"a0": ("a0", path)}, t0_ns=0)


def test_action_ids_are_unique_per_episode(tmp_path: Path) -> None:
    a = write(tmp_path / "a0.jsonl", {"event": "action", "action": 7, "ok": True})
    b = write(tmp_path / "a1.jsonl", {"event": "action", "action": "7", "ok": False})
    with pytest.raises(MetricsError, match=r"a1.jsonl:1: action '7' was already reported "
                                           r"\(a0.jsonl:1\)"):
        read_metrics({"a0": ("a0", a), "a1": ("a1", b)}, t0_ns=0)
