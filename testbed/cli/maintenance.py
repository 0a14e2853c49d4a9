"""``testbed clean`` and ``testbed faults``: what crashed runs left, and the fault suite."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from testbed.cli.common import console, positive_int, require_root


def cmd_clean(args: argparse.Namespace) -> int:
    from testbed.host.ledger import STATE_DIR, clean_all, run_state_dir

    # Root cleans every dead run's ledger; another user the ledgers of their own
    # loopback and rootless runs (temporary directories and node processes).
    removed = clean_all() if os.geteuid() == 0 else []
    if run_state_dir() != STATE_DIR:
        removed += clean_all(run_state_dir())
    out = console()
    for item in removed:
        out.print(f"removed {item}")
    if not removed:
        out.print("nothing to clean")
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    require_root("faults")
    from testbed.tools.faults import KINDS, render, run_faults, write_json

    kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else list(KINDS)
    out = console()
    results = run_faults(kinds=kinds, trials=args.trials, seed=args.seed, console=out)
    render(results, out)
    if args.json:
        write_json(results, Path(args.json))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("clean", help="remove namespaces, links and processes left by crashed runs")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("faults", help="the fault suite: kill, freeze, partition, corrupt, "
                                      "fill the disk; results for docs/reliability.md")
    p.add_argument("--trials", type=positive_int, default=20, metavar="N",
                   help="episodes (one fault each) per fault kind (default 20)")
    p.add_argument("--kinds", metavar="K1,K2", help="only these fault kinds (default all)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault points (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(func=cmd_faults)
