"""``testbed verify``: trace a run directory back to its code and inputs
(``testbed.results.verify``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

EXIT_PROBLEMS = 1


def cmd_verify(args: argparse.Namespace) -> int:
    from testbed.results.verify import verify_run

    failed = 0
    for run in args.runs:
        result = verify_run(Path(run), anchor=args.anchor)
        if result.anchored:
            print(f"{run}: anchored session(s) {', '.join(map(str, result.anchored))} "
                  "to the code digest of their revision")
        for problem in result.problems:
            print(f"{run}: {problem}")
        if result.ok:
            print(f"{run}: verified ({'; '.join(result.facts)})")
        else:
            failed += 1
    if len(args.runs) > 1:
        print(f"{len(args.runs) - failed} of {len(args.runs)} run(s) verified")
    return EXIT_PROBLEMS if failed else 0


def register(sub: Any) -> None:
    p = sub.add_parser("verify", help="check that a run directory traces back to reachable "
                                      "code, its inputs, and its plan (exit 1 on a problem)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--anchor", action="store_true",
                   help="record in the manifest the code digest of sessions that ran a "
                        "clean, reachable revision (runs made before sessions recorded it)")
    p.set_defaults(func=cmd_verify)
