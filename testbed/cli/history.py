"""``testbed history check RUN``: judge every action of a run from its recorded history.

One line per action that was not derivation-current at its issue instant, then a
summary; the lines also go to ``RUN/history/anomalies.jsonl`` (``testbed.results.history``).
Exit status: 0 when every action was current, 1 when some were stale, 2 for a history
that breaks the format (one line naming the file and line; docs/history.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.errors import UserError

EXIT_STALE = 1


def _episodes(run: Path) -> list[tuple[str, Path]]:
    from testbed.results.history import SUFFIX, episode_folders

    if not run.is_dir():
        raise UserError(f"RUN: {run} is not a directory")
    if any(p.suffix == SUFFIX and p.name != "anomalies.jsonl" for p in run.iterdir()):
        return [(run.name, run)]  # one episode's folder of host files
    found = list(episode_folders(run))
    if not found:
        raise UserError(f"RUN: {run} has no history/ (a run made before histories, or not "
                        "a run directory)")
    return found


def cmd_check(args: argparse.Namespace) -> int:
    from protocols.history import HistoryError
    from protocols.history_check import CURRENT, STALE_IN_WINDOW, check_history, describe
    from testbed.results.history import anomaly_record, read_episode, write_anomalies

    run = Path(args.run)
    records: list[dict[str, Any]] = []
    counts = {"actions": 0, "stale": 0, "window": 0, "fresh": 0, "truncated": 0}
    episodes = _episodes(run)
    for key, folder in episodes:
        try:
            histories = read_episode(folder, relative_to=run.parent)
            result = check_history(histories)
        except HistoryError as exc:
            raise UserError(str(exc)) from None
        t0 = min((h.t0_ns if h.t0_ns is not None else h.events[0].t_ns
                  for h in histories if h.events or h.t0_ns is not None), default=0)
        for note in result.truncated:
            print(f"{key}: {note}")
        counts["truncated"] += len(result.truncated)
        counts["actions"] += len(result.verdicts)
        for verdict in result.verdicts:
            if verdict.status == CURRENT:
                continue
            counts["stale"] += 1
            counts["window"] += verdict.status == STALE_IN_WINDOW
            counts["fresh"] += verdict.fresh_memory_stale_plan
            records.append(anomaly_record(key, verdict))
            if not args.quiet:
                print(f"{key}: {describe(verdict, t0)}")
    if (run / "history").is_dir():
        write_anomalies(run, records)
    print(f"{counts['actions']} action(s) in {len(episodes)} episode(s): "
          f"{counts['actions'] - counts['stale']} current, {counts['stale']} stale "
          f"({counts['window']} in a validation window, {counts['fresh']} fresh memory "
          f"with a stale plan)" + (f"; {counts['truncated']} truncated file(s)"
                                   if counts["truncated"] else ""))
    return EXIT_STALE if counts["stale"] or counts["truncated"] else 0


def register(sub: Any) -> None:
    p = sub.add_parser("history", help="judge a run's actions from its recorded history "
                                       "(docs/history.md)")
    hsub = p.add_subparsers(dest="history_cmd", required=True, metavar="SUBCOMMAND")
    c = hsub.add_parser("check", help="every action derivation-current at its issue "
                                      "instant? one line per stale action (exit 1 if any)")
    c.add_argument("run", metavar="RUN", help="a run directory, or one episode's folder "
                                              "of host history files")
    c.add_argument("--quiet", action="store_true", help="only the summary line")
    c.set_defaults(func=cmd_check)
