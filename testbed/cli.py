"""The ``testbed`` command line.

Every sub-command turns bad user input and missing kernel features into a one-line
message on stderr and exit status 2; a traceback means a bug in the testbed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console

REPO_ROOT = Path(__file__).resolve().parents[1]


class UserError(Exception):
    """Bad input or an unsuitable host: reported as one line, exit status 2."""


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(f"{what} needs root (network namespaces and TUN devices); "
                        "run it with sudo")


def _positive_int(text: str) -> int:
    """argparse type for counts: a one-line error naming what is allowed."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 1")
    return value


def _console() -> Console:
    # Piped output (CI logs, `| tee`) gets a wide console so tables are not truncated.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


# --- sub-commands --------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.doctor import render_doctor, run_doctor

    checks = run_doctor()
    render_doctor(checks, _console())
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from testbed.links.trace_cli import traces_list, traces_show

    if args.traces_cmd == "list":
        traces_list(_console())
    else:
        traces_show(args.name, Path(args.plot) if args.plot else None, _console())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from testbed.campaign import load_campaign, run_campaign
    from testbed.episode import EpisodeRunner

    campaign = load_campaign(args.campaign)
    if args.templates is not None:
        campaign = campaign.with_templates(args.templates)
    needs_root = any(cell.network != "loopback" for cell in campaign.cells())
    if needs_root:
        _require_root(f"campaign {campaign.name!r} (non-loopback networks)")
    out = Path(args.out) if args.out else REPO_ROOT / "results" / campaign.name
    console = _console()
    runner = EpisodeRunner(campaign, workdir_root=Path(args.workdir) if args.workdir else None,
                           backend=args.backend)
    trio.run(lambda: run_campaign(campaign, out, resume=args.resume, extend=args.extend,
                                  jobs=args.jobs, runner=runner, console=console))
    console.print(f"results: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from testbed.report import build_report

    run_dir = Path(args.dir)
    if not (run_dir / "episodes.parquet").exists():
        raise UserError(f"{run_dir} has no episodes.parquet "
                        "(run a campaign into it first, or finish it with --resume)")
    summary = build_report(run_dir, draws=args.draws, seed=args.seed, console=_console())
    _console().print(f"report: {run_dir / 'report.md'} ({len(summary.get('tables', []))} "
                     f"tables, {len(summary.get('figures', []))} figures)")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    _require_root("clean")
    from testbed.netns import clean_all

    removed = clean_all()
    console = _console()
    if removed:
        for item in removed:
            console.print(f"removed {item}")
    else:
        console.print("nothing to clean")
    return 0


def _load_script(name: str) -> ModuleType:
    path = REPO_ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_testbed_script_{name}", path)
    if spec is None or spec.loader is None or not path.exists():
        raise UserError(f"{path} is missing from this checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cmd_bench(args: argparse.Namespace) -> int:
    import trio

    console = _console()
    json_path = Path(args.json) if args.json else None
    result: Any
    if args.bench_cmd == "rpc":
        module = _load_script("bench_rpc")
        argv = ["--json", str(json_path)] if json_path else []
        return int(module.main(argv) or 0)
    if args.bench_cmd == "link":
        _require_root("bench link")
        from testbed.bench_link import bench_link

        result = trio.run(bench_link, json_path, console)
    else:
        from testbed.bench_episode import bench_episode

        result = trio.run(bench_episode, json_path, console)
    if json_path is None:
        console.print_json(json.dumps(result, default=str))
    return 0


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="testbed",
        description="Coordination-cost testbed: PlanFence and baselines on real sockets "
                    "over emulated LTE links.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("doctor", help="probe which kernel features and link backends work here")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("traces", help="list or show the shipped LTE capacity traces")
    tsub = p.add_subparsers(dest="traces_cmd", required=True, metavar="ACTION")
    tsub.add_parser("list", help="table of traces: length, mean capacity, longest outage")
    show = tsub.add_parser("show", help="summary of one trace, optionally a capacity plot")
    show.add_argument("name", help="trace file stem, e.g. ATT-LTE-driving.up")
    show.add_argument("--plot", metavar="FILE.png", help="write capacity over time to FILE.png")
    p.set_defaults(func=cmd_traces)

    p = sub.add_parser("run", help="run a campaign (a preset name or a TOML file)")
    p.add_argument("campaign", help="preset name (demo, primary, rates, scope, density, reuse, "
                                    "teams, horizon) or path to a campaign TOML file")
    p.add_argument("--out", metavar="DIR", help="results directory (default results/<name>)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted campaign without repeating finished episodes")
    p.add_argument("--extend", action="store_true",
                   help="like --resume, for a campaign whose grid or templates have grown "
                        "(same name, seed and options; every old cell and template kept)")
    p.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="run N topologies at once (default 1; for emulated LTE links, where "
                        "episodes wait on the link; keep 1 for loopback timing)")
    p.add_argument("--templates", type=int, metavar="N",
                   help="override the campaign's template count (quick looks)")
    p.add_argument("--backend", choices=["auto", "userspace", "netem"],
                   help="link backend (default: the campaign's option, else auto)")
    p.add_argument("--workdir", metavar="DIR", help="where node stores and sockets live "
                                                    "(default: a fresh directory under /tmp)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="tables, figures and report.md for a results directory")
    p.add_argument("dir", help="results directory written by `testbed run`")
    p.add_argument("--draws", type=int, default=10_000, help="bootstrap draws (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("clean", help="remove namespaces, links and processes left by crashed runs")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("bench", help="benchmarks (figures go to docs/benchmarks.md)")
    bsub = p.add_subparsers(dest="bench_cmd", required=True, metavar="WHICH")
    for name, text in (("rpc", "owner-head RPC latency and install latency on loopback"),
                       ("link", "request/response over emulated links vs prediction"),
                       ("episode", "PlanFence stall per action on loopback, fresh vs reuse")):
        b = bsub.add_parser(name, help=text)
        b.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.set_defaults(func=cmd_bench)
    return parser


def _user_error_types() -> tuple[type[BaseException], ...]:
    from protocols.errors import TestbedError

    types: list[type[BaseException]] = [UserError, TestbedError, ValueError, FileNotFoundError,
                                         PermissionError]
    return tuple(types)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except _user_error_types() as exc:
        if os.environ.get("TESTBED_DEBUG"):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"testbed {args.cmd}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
