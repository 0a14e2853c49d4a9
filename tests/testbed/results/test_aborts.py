"""Aborts the infrastructure caused (a live episode's model endpoint gave no answer):
recorded, run again by ``--resume``, never the verdict while another attempt exists.

Pure planning and report rules, and the ledger column an old run directory gains on
open (the end-to-end case, a server killed mid-campaign, is in
tests/testbed/run/test_live_endpoint.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd

from testbed.report.attempts import collapse
from testbed.results.aborts import retried_on_resume
from testbed.results.rundir import Attempt, RunDir, _attempt_record
from testbed.run.attempts import AttemptPolicy, plan_episode, verdict_attempt

ENDPOINT = "model_endpoint: http://127.0.0.1:8800/v1 unavailable: executor: ..."


def test_only_an_endpoint_abort_is_run_again() -> None:
    assert retried_on_resume(ENDPOINT)
    for reason in ("NodeDied: node a1 exited", "episode timeout after 600 s",
                   "initialization: RunFailure: x", "", None,
                   "ModelFailure: replan: model_endpoint"):
        assert not retried_on_resume(reason)
    row = {"episode": "e", "attempt": 1, "repeat": 1, "aborted": True,
           "abort_reason": ENDPOINT}
    assert _attempt_record(row).retry
    assert not _attempt_record({**row, "abort_reason": "NodeDied: x"}).retry
    assert not _attempt_record({**row, "aborted": False}).retry


def test_resume_plans_the_next_attempt_after_an_endpoint_abort() -> None:
    policy = AttemptPolicy()
    infra = Attempt(1, 1, False, True, True)
    plan = plan_episode([infra], policy)
    assert plan is not None
    assert plan.next_attempt == 2
    assert [(s.repeat, s.tries) for s in plan.slots] == [(1, 1)]  # no rerun used up
    assert plan_episode([infra, Attempt(2, 1, False, False)], policy) is None
    assert plan_episode([Attempt(1, 1, False, True)], policy) is None  # a node's abort
    reruns = AttemptPolicy(rerun_disturbed=1)
    plan = plan_episode([infra, Attempt(2, 1, True, False)], reruns)
    assert plan is not None
    assert [(s.repeat, s.tries) for s in plan.slots] == [(1, 1)]
    assert verdict_attempt([infra, Attempt(2, 1, False, False)]).attempt == 2
    assert verdict_attempt([infra, Attempt(2, 1, True, False)]).attempt == 2
    assert verdict_attempt([infra]).attempt == 1


def test_the_report_takes_the_verdict_from_the_attempt_that_ran() -> None:
    episodes = pd.DataFrame([
        {"episode": "e", "attempt": 1, "repeat": 1, "aborted": True, "disturbed": False,
         "abort_reason": ENDPOINT, "wall_s": 2.0},
        {"episode": "e", "attempt": 2, "repeat": 1, "aborted": False, "disturbed": False,
         "abort_reason": "", "wall_s": 9.0},
        {"episode": "f", "attempt": 1, "repeat": 1, "aborted": True, "disturbed": False,
         "abort_reason": "NodeDied: x", "wall_s": 1.0}])
    actions = pd.DataFrame([{"episode": "e", "attempt": 2, "action": "act000"}])
    out = collapse(episodes, actions)
    rows = out.episodes.set_index("episode")
    assert rows.loc["e", "attempt"] == 2
    assert not bool(rows.loc["e", "aborted"])
    assert rows.loc["e", "attempts"] == 2
    assert bool(rows.loc["f", "aborted"])
    assert len(out.actions) == 1


def test_an_old_ledger_gains_the_column_on_open(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    db = sqlite3.connect(out / "state.sqlite")
    db.execute("CREATE TABLE attempts (key TEXT NOT NULL, attempt INTEGER NOT NULL, "
               "repeat INTEGER NOT NULL, disturbed INTEGER NOT NULL, aborted INTEGER NOT "
               "NULL, PRIMARY KEY (key, attempt))")
    db.execute("INSERT INTO attempts VALUES ('e', 1, 1, 0, 1)")
    db.commit()
    db.close()
    run = RunDir(out)
    run.open()
    try:
        assert run.attempts() == {"e": [Attempt(1, 1, False, True, False)]}
    finally:
        run.close()
