"""Recorded decisions: what a live run's models decided, read back for replay campaigns.

Rules this module obeys:

1. A live run writes one JSON-lines file per committed episode under
   ``<run>/decisions/`` (:data:`DECISIONS_DIR`; ``testbed.results.decisions``), one line
   per role call: the episode's identity columns and the call as the node recorded it
   (``nodes.role_calls`` rule 2).
2. ``decisions = "path/to/live-run"`` in a replay campaign replaces the built-in
   templates' plan decisions by the decisions the live run's planners made, per workflow
   family: the ``i``-th plan of a template takes the family's recorded decision at
   ``(offset + i) mod n``, where the offset is seeded by the template and the calls are in
   episode order. So a replay schedule depends on the recorded decisions and nothing
   else of the live run, and two replays of the same run are identical.
3. Only accepted decisions replay: a call that failed (a model failure) has none. A run
   with no accepted planner decision of a family the campaign's templates need is refused
   in one line naming ``decisions``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.campaign.workload import seed_int
from testbed.errors import UserError

DECISIONS_DIR = "decisions"
SUFFIX = ".jsonl"


class DecisionsError(UserError):
    """``decisions`` names no usable live run (the campaign's fault); one line."""


def decision_files(run: Path) -> list[Path]:
    folder = run / DECISIONS_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"*{SUFFIX}") if not p.name.startswith("."))


def read_calls(run: Path) -> Iterator[dict[str, Any]]:
    """Every recorded role call of a run, file by file (episode order), line by line."""
    for path in decision_files(run):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                call = json.loads(line)
            except ValueError as exc:
                raise DecisionsError(f"decisions: {path}:{number}: not JSON ({exc})") from None
            if not isinstance(call, dict):
                raise DecisionsError(f"decisions: {path}:{number}: not a JSON object")
            yield call


@dataclass(frozen=True)
class RecordedDecisions:
    """Planner decisions of a live run, by family (rule 2)."""

    path: str
    by_family: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    digest: str = ""

    def decision(self, family: str, template: str, index: int) -> str:
        found = self.by_family.get(family, ())
        if not found:
            raise DecisionsError(f"decisions: {self.path} has no planner decision of "
                                 f"family {family!r}")
        offset = seed_int("recorded-decisions", template) % len(found)
        return found[(offset + index) % len(found)]

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "digest": self.digest,
                "decisions": {f: len(d) for f, d in sorted(self.by_family.items())}}


def load_recorded(path: str | Path, *, families: Iterable[str] = ()) -> RecordedDecisions:
    """The planner decisions recorded under ``path`` (rules 2 and 3)."""
    run = Path(path).resolve()
    if not run.is_dir():
        raise DecisionsError(f"decisions: {str(path)!r} is not a directory; allowed: the "
                             "results directory of a live run")
    if not decision_files(run):
        raise DecisionsError(f"decisions: {run} has no {DECISIONS_DIR}/*{SUFFIX}; allowed: "
                             "the results directory of a live run (kind = \"live\")")
    by_family: dict[str, list[str]] = {}
    digest = hashlib.blake2b(digest_size=16)
    for call in read_calls(run):
        if call.get("role") != "planner" or call.get("error") or not call.get("decision"):
            continue
        family = str(call.get("family", ""))
        text = json.dumps(call["decision"], sort_keys=True, separators=(",", ":"))
        by_family.setdefault(family, []).append(text)
        digest.update(f"{family}\x1f{text}\x1e".encode())
    for family in families:
        if not by_family.get(family):
            raise DecisionsError(f"decisions: {run} has no accepted planner decision of "
                                 f"family {family!r}; the campaign's templates need one")
    return RecordedDecisions(str(run), {f: tuple(d) for f, d in by_family.items()},
                             digest.hexdigest())
