"""Writing a live run's recorded decisions into its run directory.

One JSON-lines file per committed episode, ``<run>/decisions/<episode>.jsonl`` (the
episode key with ``/`` as ``~``), written atomically before the episode's shards, so a
committed episode always has its decisions (``testbed.campaign.decisions`` reads them).
Each line is one role call with the episode's identity columns; the API key is never in
a call (the node never puts it there).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.campaign.decisions import DECISIONS_DIR, SUFFIX
from testbed.results.atomic import TMP_MARK


def decisions_path(run: Path, key: str) -> Path:
    return run / DECISIONS_DIR / (key.replace("/", "~") + SUFFIX)


def write_decisions(run: Path, key: str, calls: Sequence[Mapping[str, Any]],
                    identity: Mapping[str, Any]) -> Path:
    """Write one episode's role calls (with ``identity`` columns on every line)."""
    final = decisions_path(run, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            for call in calls:
                f.write(json.dumps({**identity, **call}, sort_keys=True, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final
