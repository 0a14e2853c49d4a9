"""``testbed reproduce``: rerun a recorded run at the size asked and say whether it
reproduced (planning: ``testbed.run.reproduce``; comparison and verdicts:
``testbed.report.reproduce``; docs/reproduce.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.cluster import add_access_args
from testbed.cli.common import cluster_spec, console, directory, positive_int
from testbed.errors import UserError

VERDICT_STYLE = {"reproduced": "green", "not reproduced": "red", "skipped": "dim"}


def _claims_file(args: argparse.Namespace, run: Path) -> Path | None:
    """--claims, else the nearest claims.toml above the run (results/claims.toml for a
    reference run), else none; read once here so a bad file stops before the rerun."""
    from testbed.report.claims import load_claims

    if args.claims is None:
        found = [d / "claims.toml" for d in run.resolve().parents if (d / "claims.toml").is_file()]
        if not found:
            return None
        path = found[0]
    else:
        path = Path(args.claims)
        if not path.is_file():
            raise UserError(f"--claims: {args.claims} is not a file; allowed: a claims TOML "
                            "file (results/claims.toml's format)")
    try:
        load_claims(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--claims: {path}: unreadable ({exc})") from None
    return path


def cmd_reproduce(args: argparse.Namespace) -> int:
    from testbed.cli.campaigns import _ended, _execute
    from testbed.report.reproduce import compare_rerun, write_reproduction
    from testbed.run import reproduce as planning
    from testbed.run.attempts import AttemptPolicy

    reference = planning.read_reference(Path(args.run))
    rerun = planning.plan(reference, templates=args.templates, cells=args.cells)
    claims = _claims_file(args, reference.path)
    out = directory("--out", args.out) or planning.default_out(reference)
    planning.check_out(out, rerun, resume=args.resume)
    try:
        summary = _execute(args, rerun.campaign, out, AttemptPolicy(1, 0), resume=args.resume,
                           extend=False)
    finally:
        planning.record(out, rerun)  # what it reproduces, also for a --resume later
    status = _ended(summary)
    result = compare_rerun(reference.path, out, claims_file=claims)
    md, page = write_reproduction(result)
    _print(result)
    console().print(f"reproduction: {md}, {page}", markup=False)
    return status


def _print(result: Any) -> None:
    from rich.table import Table

    from testbed.report.reproduce import header_lines, summary_rows

    out = console()
    for line in header_lines(result):
        out.print(line, markup=False)
    rows = summary_rows(result)
    if not rows:
        return
    table = Table(title=f"claims about {result.name}", show_lines=False)
    for name in ("verdict", "claim", "why"):
        table.add_column(name, overflow="fold")
    for verdict, text, why in rows:
        style = VERDICT_STYLE.get(verdict, "yellow")
        table.add_row(verdict, text, why, style=style)
    out.print(table)


def register(sub: Any) -> None:
    from testbed.links.backend import BACKEND_CHOICES as BACKENDS  # light: no registries

    p = sub.add_parser("reproduce", help="rerun a recorded run (its cells, templates and "
                                         "seeds) and say whether its claims reproduced")
    p.add_argument("run", metavar="RUN", help="a run directory written by `testbed run` "
                                              "(e.g. results/primary)")
    p.add_argument("--templates", type=int, metavar="N",
                   help="rerun the run's first N templates (default: all of them)")
    p.add_argument("--cells", metavar="FILTER",
                   help="rerun only the cells that match FIELD=V1,V2;FIELD=V3 (e.g. "
                        "policy=planfence,batched_all_key;network=att; default: all)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                       help="run N topologies at once in this process (as `testbed run`)")
    where.add_argument("--cluster", metavar="SPEC", type=cluster_spec,
                       help="run the work units on a dask cluster: local:N or tls://HOST:PORT "
                            "(as `testbed run`)")
    add_access_args(p)
    p.add_argument("--out", metavar="DIR",
                   help="the rerun's directory (default reproduce/<run name>); it must be "
                        "empty unless --resume")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted reproduction in --out (and compare again)")
    p.add_argument("--claims", metavar="FILE",
                   help="claims file (default: the nearest claims.toml above RUN, i.e. "
                        "results/claims.toml for a reference run)")
    p.add_argument("--backend", choices=list(BACKENDS),
                   help="link backend for the shaped networks (default: the run's option)")
    p.add_argument("--workdir", metavar="DIR", help="where node stores and sockets live")
    p.add_argument("--host-lanes", type=positive_int, default=None, metavar="N",
                   help="lanes all `testbed run`s on this host may hold at once (as "
                        "`testbed run`)")
    p.add_argument("--allow-code-change", action="store_true",
                   help="--resume with code other than the reproduction's last session "
                        "(as `testbed run`)")
    p.add_argument("--allow-mixed-backends", action="store_true",
                   help="let cluster workers run shaped networks on different link backends")
    p.set_defaults(func=cmd_reproduce, allow_dirty=False)
