"""The ``testbed`` command line.

Whose fault it was decides how a failure ends (``testbed.errors``): bad user input is
one line on stderr and exit status 2; a host that lacks something is one line and exit
status 3; anything else is a bug in the testbed and shows its traceback (exit 1).
``TESTBED_DEBUG=1`` shows the traceback of the first two kinds too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

from testbed.errors import HostError, UserError, one_line

DEFAULT_RESULTS = Path("results")
EXIT_USER, EXIT_HOST = 2, 3


def version() -> str:
    try:
        return metadata.version("planfence-testbed")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise HostError(f"{what} needs root (network namespaces and TUN devices); "
                        "run it as root or with sudo")


USERNS_ENV = "TESTBED_IN_NEW_USERNS"
"""Set when ``testbed`` re-executes itself to start inside a user namespace of its own."""
_argv: list[str] = []


def _require_namespaces(what: str) -> None:
    """Root, or else a user namespace of our own (a rootless run, testbed.host.userns).

    The kernel gives a user namespace only to a single-threaded process, and by now
    numpy's libraries have started threads: so the command re-executes itself, and the
    fresh process enters the namespace first thing (``main``).
    """
    if os.geteuid() == 0:
        return
    from testbed.host.userns import probe

    works, detail = probe()
    if not works:
        raise HostError(f"{what} needs root or unprivileged user namespaces ({detail}); "
                        "run it as root")
    os.environ[USERNS_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "testbed", *_argv])


def _enter_requested_namespace() -> None:
    if os.environ.pop(USERNS_ENV, None) != "1":
        return
    from testbed.host.userns import enter_user_namespace

    enter_user_namespace()


def _positive_int(text: str) -> int:
    """argparse type for counts: a one-line error naming what is allowed."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 1")
    return value


def _counts(text: str) -> tuple[int, ...]:
    """argparse type for a comma-separated list of counts >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: counts >= 1, "
                                         "comma-separated (e.g. 1,2,4)")
    return values


def _directory(flag: str, text: str | None) -> Path | None:
    """A directory flag's value: absent, an existing directory, or a path to create."""
    if text is None:
        return None
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {text} is not a directory; allowed: a directory "
                        "(existing or to be created)")
    return path


def _console() -> Console:
    # Piped output (CI logs, `| tee`) gets a wide console so tables are not truncated.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


# --- sub-commands --------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.tools.doctor import render_doctor, run_doctor

    render_doctor(run_doctor(), _console())
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from testbed.tools.traces_view import traces_list, traces_show

    if args.traces_cmd == "list":
        traces_list(_console())
    else:
        traces_show(args.name, Path(args.plot) if args.plot else None, _console())
    return 0


def cmd_networks(args: argparse.Namespace) -> int:
    from testbed.tools.networks_view import networks_list, networks_show

    if args.networks_cmd == "list":
        networks_list(_console(), campaign=args.campaign)
    else:
        networks_show(args.name, _console(), campaign=args.campaign,
                      plot=Path(args.plot) if args.plot else None)
    return 0


def _load(args: argparse.Namespace) -> Any:
    from testbed.campaign.networks import check_backend
    from testbed.campaign.parse import load_campaign

    campaign = load_campaign(args.campaign)
    if args.templates is not None:
        campaign = campaign.with_templates(args.templates)
    check_backend(campaign, args.backend or campaign.options.backend)
    return campaign


def cmd_check(args: argparse.Namespace) -> int:
    from testbed.tools.plan_view import print_plan

    campaign = _load(args)
    jobs = args.jobs if args.jobs is not None else campaign.execution.jobs
    print_plan(campaign, _console(), jobs=jobs, backend=args.backend)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from testbed.host.ledger import Ledger, clean_dead_runs, open_run_ledger, run_state_dir
    from testbed.run.episode import EpisodeRunner
    from testbed.run.loop import run_campaign

    if args.dry_run:
        return cmd_check(args)
    campaign = _load(args)
    out = _directory("--out", args.out) or DEFAULT_RESULTS / campaign.name
    workdir = _directory("--workdir", args.workdir)
    cluster = args.cluster or campaign.execution.cluster
    jobs = args.jobs if args.jobs is not None else campaign.execution.jobs
    mixed = args.allow_mixed_backends or campaign.execution.allow_mixed_backends
    shaped = any(campaign.network_profile(n).link is not None for n in campaign.network_names())
    if shaped and (cluster is None or cluster.startswith("local:")):
        _require_namespaces(f"campaign {campaign.name!r} (non-loopback networks)")
    if cluster is not None and campaign.options.link_log:
        raise UserError("options.link_log: packet logs are written by runs in this process "
                        "(--jobs), not on a cluster; drop --cluster or link_log")
    console = _console()
    label = str(Path(out).absolute())
    if args.resume or args.extend:  # what a killed run on this directory left behind
        for item in clean_dead_runs(run_state_dir(), label=label):
            console.print(f"removed {item} (left by an interrupted run)")

    async def main(ledger: Ledger) -> None:
        if cluster is None:
            runner = EpisodeRunner(campaign, workdir_root=workdir, backend=args.backend,
                                   ledger=ledger, link_log_dir=out / "links",
                                   shared_emulator=jobs > 1)
            await run_campaign(campaign, out, resume=args.resume, extend=args.extend,
                               jobs=jobs, runner=runner, console=console)
            return
        from testbed.run.dask_engine import open_dask_engine

        async with open_dask_engine(cluster, backend=args.backend, workdir=workdir,
                                    allow_mixed_backends=mixed) as engine:
            await engine.survey(campaign)
            await run_campaign(campaign, out, resume=args.resume, extend=args.extend,
                               engine=engine, console=console)

    with open_run_ledger(label) as ledger:
        trio.run(main, ledger)
    console.print(f"results: {out}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from testbed.tools.worker import run_worker

    return run_worker(args.scheduler, lanes=args.lanes, name=args.name,
                      loopback_only=args.loopback_only, console=_console())


def cmd_report(args: argparse.Namespace) -> int:
    from testbed.report.build import build_report

    run_dir = Path(args.dir)
    if not (run_dir / "episodes.parquet").exists():
        raise UserError(f"{run_dir} has no episodes.parquet "
                        "(run a campaign into it first, or finish it with --resume)")
    summary = build_report(run_dir, draws=args.draws, seed=args.seed, console=_console(),
                           episode=args.episode)
    _console().print(f"report: {run_dir / 'report.md'} ({len(summary.get('tables', []))} "
                     f"tables, {len(summary.get('figures', []))} figures)")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from testbed.host.ledger import STATE_DIR, clean_all, run_state_dir

    # Root cleans every dead run's ledger; another user the ledgers of their own
    # loopback and rootless runs (temporary directories and node processes).
    removed = clean_all() if os.geteuid() == 0 else []
    if run_state_dir() != STATE_DIR:
        removed += clean_all(run_state_dir())
    console = _console()
    for item in removed:
        console.print(f"removed {item}")
    if not removed:
        console.print("nothing to clean")
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    _require_root("faults")
    from testbed.tools.faults import KINDS, render, run_faults, write_json

    kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else list(KINDS)
    console = _console()
    results = run_faults(kinds=kinds, trials=args.trials, seed=args.seed, console=console)
    render(results, console)
    if args.json:
        write_json(results, Path(args.json))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import trio

    console = _console()
    json_path = Path(args.json) if args.json else None
    result: Any
    if args.bench_cmd == "rpc":
        from testbed.tools.bench_rpc import run_bench

        result = run_bench()
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    elif args.bench_cmd == "link":
        _require_namespaces("bench link")
        from testbed.tools.bench_link import bench_link

        result = trio.run(partial(bench_link, json_path, console, backend=args.backend))
    elif args.bench_cmd == "transfer":
        _require_namespaces("bench transfer")
        from testbed.tools.bench_transfer import bench_transfer, write_transfer

        result = trio.run(lambda: bench_transfer(console, samples=args.samples))
        paths = write_transfer(result, Path(args.out or "results/transfer"))
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2) + "\n")
        console.print("transfer: " + ", ".join(map(str, paths)))
        return 0
    elif args.bench_cmd == "limits":
        if args.network != "loopback":
            _require_root(f"bench limits --network {args.network}")
        from testbed.tools.bench_limits import bench_limits

        result = trio.run(lambda: bench_limits(
            console, network=args.network, templates=args.templates,
            policies=args.policies.split(",") if args.policies else ()))
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2) + "\n")
        return 0  # the table is printed
    elif args.bench_cmd == "lanes":
        _require_namespaces("bench lanes")
        from testbed.tools.bench_lanes import bench_lanes

        result = trio.run(lambda: bench_lanes(json_path, console, lanes=args.lanes,
                                              workers=args.workers, templates=args.templates,
                                              emulator=args.emulator))
    else:
        from testbed.tools.bench_episode import bench_episode

        result = trio.run(lambda: bench_episode(json_path, console,
                                                loopback_only=args.loopback_only))
    if json_path is None or args.bench_cmd == "rpc":
        console.print_json(json.dumps(result, default=str))
    return 0


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from testbed.campaign.vocabulary import BACKENDS

    parser = argparse.ArgumentParser(
        prog="testbed",
        description="Coordination-cost testbed: PlanFence and baselines on real sockets "
                    "over emulated LTE links.")
    parser.add_argument("--version", action="version", version=f"testbed {version()}")
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

    p = sub.add_parser("networks", help="list or show the networks a campaign can name")
    nsub = p.add_subparsers(dest="networks_cmd", required=True, metavar="ACTION")
    nlist = nsub.add_parser("list", help="every network: base RTT, capacity, longest outage")
    nlist.add_argument("--campaign", metavar="FILE", help="also the networks FILE defines")
    nshow = nsub.add_parser("show", help="one network resolved: its definition, links, RTTs")
    nshow.add_argument("name", help="a network name (see `testbed networks list`)")
    nshow.add_argument("--campaign", metavar="FILE", help="look in FILE's [networks] too")
    nshow.add_argument("--plot", metavar="FILE.png", help="write its capacity over time")
    p.set_defaults(func=cmd_networks)

    p = sub.add_parser("check", help="validate a campaign and print its plan; creates nothing")
    p.add_argument("campaign", help="preset name or path to a campaign TOML file")
    p.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                   help="lanes the wall-time estimate assumes (default: [execution] jobs, else 1)")
    p.add_argument("--templates", type=int, metavar="N", help="override the template count")
    p.add_argument("--backend", choices=list(BACKENDS), help="backend to plan for")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run a campaign (a preset name or a TOML file)")
    p.add_argument("campaign", help="preset name (demo, primary, rates, scope, density, reuse, "
                                    "teams, horizon) or path to a campaign TOML file")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan (cells, episodes, networks, wall-time "
                        "estimate) without creating anything")
    p.add_argument("--out", metavar="DIR", help="results directory (default results/<name>)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted campaign without repeating finished episodes")
    p.add_argument("--extend", action="store_true",
                   help="like --resume, for a campaign whose grid or templates have grown "
                        "(same name, seed and options; every old cell and template kept)")
    p.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                   help="run N topologies at once in this process (default: the "
                        "campaign's [execution] jobs, else 1; for emulated links, where "
                        "episodes wait on the link; loopback units always run alone)")
    p.add_argument("--cluster", metavar="SPEC",
                   help="run the work units on a dask cluster: local:N (N worker "
                        "processes here) or tcp://HOST:PORT of a scheduler with `testbed "
                        "worker`s (default: the campaign's [execution] cluster, else here)")
    p.add_argument("--allow-mixed-backends", action="store_true",
                   help="let cluster workers run shaped networks on different link backends")
    p.add_argument("--templates", type=int, metavar="N",
                   help="override the campaign's template count (quick looks)")
    p.add_argument("--backend", choices=list(BACKENDS),
                   help="link backend for the shaped networks (default: the campaign's "
                        "option, else auto); unshaped ones (loopback) never get one")
    p.add_argument("--workdir", metavar="DIR", help="where node stores and sockets live "
                                                    "(default: a fresh directory under /tmp)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("worker", help="serve this host as a dask worker for campaigns")
    p.add_argument("scheduler", help="scheduler address, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--lanes", type=_positive_int, default=1, metavar="N",
                   help="work units this host runs at once (default 1)")
    p.add_argument("--name", help="worker name (default: dask's)")
    p.add_argument("--loopback-only", action="store_true",
                   help="serve even if no link backend works (loopback campaigns only)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("report", help="tables, figures and report.md for a results directory")
    p.add_argument("dir", help="results directory written by `testbed run`")
    p.add_argument("--draws", type=int, default=10_000, help="bootstrap draws (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--episode", metavar="KEY",
                   help="draw the link plots of this episode (default: the first episode "
                        "with a link log of each network)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("clean", help="remove namespaces, links and processes left by crashed runs")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("faults", help="the fault suite: kill, freeze, partition, corrupt, "
                                      "fill the disk; results for docs/reliability.md")
    p.add_argument("--trials", type=_positive_int, default=20, metavar="N",
                   help="episodes (one fault each) per fault kind (default 20)")
    p.add_argument("--kinds", metavar="K1,K2", help="only these fault kinds (default all)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault points (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(func=cmd_faults)

    p = sub.add_parser("bench", help="benchmarks (figures go to docs/benchmarks.md)")
    bsub = p.add_subparsers(dest="bench_cmd", required=True, metavar="WHICH")
    for name, text in (("rpc", "owner-head RPC latency and install latency on loopback"),
                       ("link", "request/response over emulated links vs prediction"),
                       ("episode", "PlanFence stall per action on loopback, fresh vs reuse"),
                       ("limits", "the primary grid's peak connections, objects and installs "
                                  "against the node limits"),
                       ("lanes", "AT&T episodes at 1-16 lanes and on a LocalCluster"),
                       ("transfer", "one fresh authenticated transfer against payload and "
                                    "loss on a wired, an LTE and a LEO-like network (fig. C.1)")):
        b = bsub.add_parser(name, help=text)
        b.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
        if name == "transfer":
            b.add_argument("--out", metavar="DIR",
                           help="where transfer.json and fig_c1.png go (default results/transfer)")
            b.add_argument("--samples", type=_positive_int, default=20, metavar="N",
                           help="transfers per payload size and loss rate (default 20)")
        if name == "link":
            b.add_argument("--backend", choices=["userspace", "netem"], default="userspace",
                           help="link backend to measure (default userspace)")
        if name == "episode":
            b.add_argument("--loopback-only", action="store_true",
                           help="only the loopback cells (skip the AT&T cell run as root)")
        if name == "limits":
            b.add_argument("--network", default="loopback",
                           help="network of the primary grid to run (default loopback)")
            b.add_argument("--templates", type=_positive_int, default=1, metavar="N",
                           help="templates per cell (default 1)")
            b.add_argument("--policies", metavar="P1,P2",
                           help="only these policies (default: every policy of primary)")
        if name == "lanes":
            b.add_argument("--lanes", type=_counts, default=(1, 2, 4, 8, 16), metavar="N,N",
                           help="local lane counts (default 1,2,4,8,16)")
            b.add_argument("--workers", type=_counts, default=(1, 2, 4), metavar="N,N",
                           help="LocalCluster worker counts (default 1,2,4)")
            b.add_argument("--templates", type=_positive_int, default=None, metavar="N",
                           help="templates (units) per run (default: the largest count)")
            b.add_argument("--emulator", choices=("shared", "per-lane"), default="shared",
                           help="one emulator for every lane (default) or one per lane")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _argv[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        _enter_requested_namespace()  # before anything (numpy) starts a thread
    except HostError as exc:
        print(f"testbed: {one_line(exc)}", file=sys.stderr)
        return EXIT_HOST
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except (UserError, HostError) as exc:
        if os.environ.get("TESTBED_DEBUG"):
            raise
        print(f"testbed {args.cmd}: {one_line(exc)}", file=sys.stderr)
        return EXIT_USER if isinstance(exc, UserError) else EXIT_HOST


if __name__ == "__main__":
    sys.exit(main())
