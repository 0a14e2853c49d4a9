"""Every committed run whose sessions all record their code verifies against this
repository (``testbed verify``): a reference run made since sessions record their code,
or anchored to a clean revision, must stay traceable (revision reachable, code digest,
lock, traces, campaign file, episodes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testbed.results import provenance
from testbed.results.verify import verify_run

RESULTS = Path(__file__).resolve().parents[3] / "results"


def _recorded_runs() -> list[Path]:
    runs = []
    for manifest in sorted(RESULTS.rglob("manifest.json")):
        sessions = json.loads(manifest.read_text()).get("sessions") or []
        if sessions and all((s.get("git") or {}).get("code_sha256") for s in sessions):
            runs.append(manifest.parent)
    return runs


def _shallow() -> bool:
    try:
        out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"],
                             cwd=provenance.SOURCE_ROOT, capture_output=True, text=True,
                             check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return True
    return out == "true"


@pytest.mark.skipif(_shallow(), reason="a shallow or absent git history: revisions "
                                       "cannot be checked (clone with full history)")
@pytest.mark.parametrize("run", _recorded_runs(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_run_that_records_its_code_verifies(run: Path) -> None:
    result = verify_run(run)
    assert result.ok, "\n".join(result.problems)


def test_some_committed_runs_record_their_code() -> None:
    assert len(_recorded_runs()) >= 5
