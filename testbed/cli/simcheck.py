"""``testbed sim-check RUN``: a packet-level run's cells rerun in the simulator, compared."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from testbed.cli.common import console, positive_int


def cmd_sim_check(args: argparse.Namespace) -> int:
    from testbed.errors import UserError
    from testbed.sim.calibration import load
    from testbed.sim.check import check_run

    run_dir = Path(args.run)
    if not (run_dir / "manifest.json").is_file():
        raise UserError(f"{run_dir}: not a run directory (no manifest.json)")
    calibration = load(Path(args.calibration) if args.calibration else None)
    checks = check_run(run_dir, calibration, policies=args.policy,
                       connections=args.connection, templates=args.templates,
                       paper=args.paper, networks=args.network)
    out = console()
    out.print(f"sim-check {run_dir} with calibration {calibration.id} ({calibration.host}, "
              f"{calibration.revision[:12]}); stall ratio = sim / packet-level median per "
              "action, 95% bootstrap interval over templates", markup=False, soft_wrap=True)
    for c in checks:
        out.print(f"{c.cell:<58} templates {c.templates:>2} actions "
                  f"{c.actions:>4}  packet {c.packet_median_ms:8.1f} ms  sim "
                  f"{c.sim_median_ms:8.1f} ms  ratio {c.ratio:.3f} [{c.ratio_lo:.3f}, "
                  f"{c.ratio_hi:.3f}]  bytes equal {c.bytes_equal:.0%}  rounds equal "
                  f"{c.rounds_equal:.0%}"
                  + (f"  paper's harness {c.paper_median_ms:8.1f} ms (ratio "
                     f"{c.paper_ratio:.3f})" if c.paper_median_ms is not None
                     and c.paper_ratio is not None else "")
                  + (f"  note: {c.note}" if c.note else ""),
                  markup=False, soft_wrap=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"run": str(run_dir), "calibration": calibration.to_json(),
             "cells": [c.row() for c in checks]}, indent=2, sort_keys=True) + "\n")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("sim-check", help="rerun a packet-level run's cells in the simulator "
                                         "and compare stall and bytes per cell")
    p.add_argument("run", help="a run directory (e.g. results/primary)")
    p.add_argument("--policy", action="append", default=[], metavar="NAME",
                   help="only this policy's cells (repeatable; default: every cell)")
    p.add_argument("--connection", action="append", default=[], metavar="SETTING",
                   help="only cells with this connection setting (repeatable)")
    p.add_argument("--network", action="append", default=[], metavar="NAME",
                   help="only cells on this network (repeatable)")
    p.add_argument("--templates", type=positive_int, default=3, metavar="N",
                   help="the first N templates of the run per cell (default 3)")
    p.add_argument("--calibration", metavar="FILE",
                   help="the calibration to charge (default: `testbed calibrate sim`'s file)")
    p.add_argument("--paper", action="store_true",
                   help="also run each cell under the paper's harness model (one trace "
                        "delay per exchange, no handshake, no CPU) and show it beside")
    p.add_argument("--json", metavar="FILE", help="also write the comparison here")
    p.set_defaults(func=cmd_sim_check)
