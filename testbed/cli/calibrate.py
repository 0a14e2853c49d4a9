"""``testbed calibrate sim``: the service times the sim backend charges, measured here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.common import console, positive_int


def cmd_calibrate(args: argparse.Namespace) -> int:
    from testbed.errors import UserError
    from testbed.sim.calibration import measure, save

    if args.calls < 100:
        raise UserError(f"--calls: {args.calls} is not allowed; allowed: an integer >= 100")
    out = console()
    out.print(f"calibrate sim: {args.calls} calls per setting to a real node on loopback "
              "(testbed.tools.bench_rpc)", markup=False)
    calibration = measure(calls=args.calls)
    path = save(calibration, Path(args.out) if args.out else None)
    out.print(f"calibrate sim: {calibration.id}: exchange {calibration.exchange_ms:.3f} ms, "
              f"handshake {calibration.handshake_ms:.3f} ms, install "
              f"{calibration.install_ms:.3f} ms on {calibration.host} at "
              f"{calibration.revision[:12]}; written to {path}", markup=False)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="measure what a simulator charges for the nodes' "
                                         "own work (sim: testbed run --backend sim)")
    p.add_argument("what", choices=["sim"], help="sim: service times of this host's nodes")
    p.add_argument("--calls", type=positive_int, default=600, metavar="N",
                   help="calls per setting (default 600, at least 100)")
    p.add_argument("--out", metavar="FILE",
                   help="where to write the calibration (default: $TESTBED_SIM_CALIBRATION, "
                        "else ~/.local/state/planfence-testbed/sim-calibration.json)")
    p.set_defaults(func=cmd_calibrate)
