"""``testbed worker``: this host as a dask worker for campaigns (docs/cluster.md)."""

from __future__ import annotations

import argparse
from typing import Any

from testbed.cli.common import console, positive_int


def cmd_worker(args: argparse.Namespace) -> int:
    from testbed.tools.worker import run_worker

    return run_worker(args.scheduler, lanes=args.lanes, name=args.name,
                      loopback_only=args.loopback_only, console=console())


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="serve this host as a dask worker for campaigns")
    p.add_argument("scheduler", help="scheduler address, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--lanes", type=positive_int, default=1, metavar="N",
                   help="work units this host runs at once (default 1)")
    p.add_argument("--name", help="worker name (default: dask's)")
    p.add_argument("--loopback-only", action="store_true",
                   help="serve even if no link backend works (loopback campaigns only)")
    p.set_defaults(func=cmd_worker)
