"""Precision on the command line: ``run``'s repeats, reruns and ``--until-resolved``, and
``testbed spread`` (the stored per-episode spread that ``testbed check`` sizes
campaigns from)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.common import console, positive_int
from testbed.errors import UserError


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 0")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of percent") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: 0 < PCT < 100")
    return value


def comparison_spec(text: str) -> tuple[str, str]:
    """``A:B``: policy A against policy B (paired per configuration)."""
    a, sep, b = text.partition(":")
    if not sep or not a or not b or a == b:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; allowed: A:B with two different policy names, "
            "e.g. planfence:batched_all_key")
    return a, b


def add_precision_arguments(p: argparse.ArgumentParser) -> None:
    """``run``'s options for repeats, reruns and growing a campaign until resolved."""
    p.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="run every episode R times with the same schedule (separate "
                        "attempts; the episode's cost is their median)")
    p.add_argument("--rerun-disturbed", type=_non_negative_int, default=0, metavar="N",
                   help="rerun an attempt whose nodes were disturbed (docs/campaigns.md, "
                        "'Disturbance') up to N times with the same schedule; every "
                        "attempt is kept, the first undisturbed one is the verdict")
    p.add_argument("--until-resolved", type=_percent, default=None, metavar="PCT",
                   help="grow the campaign (more templates, then repeats) until every "
                        "--compare is resolved to +-PCT%% or --max-templates and "
                        "--max-repeats are reached")
    p.add_argument("--compare", type=comparison_spec, action="append", default=[],
                   metavar="A:B", help="a comparison --until-resolved watches: policy A "
                                       "against policy B in every configuration (repeatable)")
    p.add_argument("--max-templates", type=positive_int, default=None, metavar="T",
                   help="--until-resolved: at most T templates (default: all 30)")
    p.add_argument("--max-repeats", type=positive_int, default=1, metavar="R",
                   help="--until-resolved: at most R repeats per episode (default 1)")


def cmd_spread(args: argparse.Namespace) -> int:
    from testbed.report.spread import measure_spread, read_spread_table, write_spread_table

    runs = [Path(d) for d in args.dirs]
    for run in runs:
        if not (run / "episodes.parquet").exists():
            raise UserError(f"{run}: no episodes.parquet (a run directory written by "
                            "`testbed run`)")
    out = console()
    measured = measure_spread(runs)
    if not measured:
        raise UserError("spread: these runs hold no paired policies on a shaped or "
                        "loopback network to measure")
    for row in measured:
        out.print(row.describe())
    if args.write:
        path = Path(args.write)
        table = read_spread_table(path) if path.exists() else {}
        table.update({row.key: row for row in measured})
        write_spread_table(path, table)
        out.print(f"spread: {len(measured)} rows written to {path}")
    return 0


def register(sub: Any) -> None:
    from testbed.report import SPREAD_TABLE as spread_table  # not .spread: numpy
    p = sub.add_parser("spread", help="measure the per-episode spread of runs (what "
                                      "`testbed check` sizes campaigns from)")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories")
    p.add_argument("--write", metavar="FILE", nargs="?", const=str(spread_table),
                   help=f"merge the measurements into FILE (default: the shipped table "
                        f"{spread_table.name})")
    p.set_defaults(func=cmd_spread)
