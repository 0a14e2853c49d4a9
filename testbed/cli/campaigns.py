"""``testbed check``, ``testbed run`` and ``testbed report``: a campaign from file to tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.cluster import access_from, add_access_args
from testbed.cli.common import (
    ARGV,
    DEFAULT_RESULTS,
    EXIT_ALL_ABORTED,
    EXIT_UNITS_FAILED,
    check_namespaces,
    cluster_spec,
    console,
    directory,
    positive_int,
    require_namespaces,
)
from testbed.cli.precision import add_precision_arguments
from testbed.errors import HostError, UserError
from testbed.links.backend import SIM_BACKEND


def _load(args: argparse.Namespace) -> Any:
    from testbed import api
    from testbed.campaign.networks import check_backend

    try:
        campaign = api.load(args.campaign, plugins=args.plugin, templates=args.templates)
    except UserError as exc:
        if str(exc).startswith("templates:") and args.templates is not None:
            raise UserError(f"--{exc}") from None  # the flag's name, not the file's field
        raise
    if args.model_url is not None or args.model is not None:
        from testbed.campaign.live_parse import with_endpoint

        campaign = with_endpoint(campaign, base_url=args.model_url, model=args.model)
    check_backend(campaign, args.backend or campaign.options.backend)
    return campaign


def _warn(args: argparse.Namespace, campaign: Any, jobs: int) -> None:
    """Allowed but probably a mistake: one line each on stderr (testbed.campaign.advice)."""
    from testbed import api

    for line in api.warnings(campaign, jobs=jobs):
        print(f"testbed {args.cmd}: warning: {line}", file=sys.stderr)


def cmd_check(args: argparse.Namespace) -> int:
    from testbed import api

    campaign = _load(args)
    jobs = args.jobs if args.jobs is not None else campaign.execution.jobs
    cluster = getattr(args, "cluster", None) or campaign.execution.cluster
    _warn(args, campaign, jobs)
    shaped = any(campaign.network_profile(n).link is not None for n in campaign.network_names())
    if shaped and (cluster is None or cluster.startswith("local:")):
        check_namespaces(f"campaign {campaign.name!r} (non-loopback networks)")
    out = console()
    for line in api.check(campaign, jobs=jobs, backend=args.backend, cluster=cluster,
                          repeats=args.repeats):
        out.print(line, markup=False)
    out.print("dry run: nothing was created (no run directory, no namespace)", markup=False)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.run.attempts import AttemptPolicy

    if args.dry_run:
        return cmd_check(args)
    campaign = _load(args)
    out = directory("--out", args.out) or DEFAULT_RESULTS / campaign.name
    _check_again(args, out)
    try:
        if args.until_resolved is not None:
            from testbed.tools.until_resolved import run_until_resolved

            summaries: list[Any] = []

            def execute(grown: Any, attempts: Any, resume: bool, extend: bool) -> None:
                summaries.append(_execute(args, grown, out, attempts, resume=resume,
                                          extend=extend))

            status = run_until_resolved(args, campaign, out, execute, console())
            return max([status, *(_ended(summary) for summary in summaries)])
        summary = _execute(args, campaign, out,
                           AttemptPolicy(args.repeats, args.rerun_disturbed),
                           resume=args.resume, extend=args.extend)
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        from testbed import interrupts

        if not interrupts.is_interrupt(exc):
            raise
        raise interrupts.Interrupted(_kept(out), interrupts.signal_of(exc)) from None
    console().print(f"results: {out}")
    return _ended(summary)


def _check_again(args: argparse.Namespace, out: Path) -> None:
    """``--resume`` / ``--extend`` continue a run: refuse a directory that does not
    exist (they would silently start a new run there)."""
    flag = "--resume" if args.resume else "--extend" if args.extend else None
    if flag is not None and not out.exists():
        raise UserError(f"{flag}: {out} does not exist; there is no run to "
                        f"{flag.removeprefix('--')} (check --out, or drop {flag} to start "
                        "a new run there)")


def _kept(out: Path) -> str:
    """What an interrupted run leaves (testbed.interrupts): its committed episodes."""
    from testbed.results.rundir import RunDir

    run_dir = RunDir(out)
    if not run_dir.manifest_path.exists():  # stopped before its first episode: removed
        return "no episode was kept, nothing to resume"
    kept = len(run_dir.completed())
    return f"{kept} episode{'s' if kept != 1 else ''} kept, resume with --resume"


def _execute(args: argparse.Namespace, campaign: Any, out: Path, attempts: Any, *,
             resume: bool, extend: bool) -> Any:
    """Run (or resume, or extend) ``campaign`` into ``out`` as ``testbed run`` does; the
    run's summary (``RunSummary``)."""
    from testbed import api

    workdir = directory("--workdir", args.workdir)
    cluster = args.cluster or campaign.execution.cluster
    jobs = args.jobs if args.jobs is not None else campaign.execution.jobs
    mixed = args.allow_mixed_backends or campaign.execution.allow_mixed_backends
    shaped = any(campaign.network_profile(n).link is not None for n in campaign.network_names())
    simulated = (args.backend or campaign.options.backend) == SIM_BACKEND
    if not simulated and getattr(args, "calibration", None) is not None:
        raise UserError("--calibration: only the sim backend reads a calibration; add "
                        "--backend sim or drop --calibration")
    if shaped and not simulated and (cluster is None or cluster.startswith("local:")):
        require_namespaces(f"campaign {campaign.name!r} (non-loopback networks)")
    if not getattr(args, "warned", False):  # after a rootless re-execution, so once
        _warn(args, campaign, jobs)  # (and once for all rounds of --until-resolved)
        args.warned = True
    out_console = console()
    # what a reference run may override (`testbed reproduce` shares this path)
    dirty, code_change, side = (bool(getattr(args, name, False)) for name in (
        "allow_dirty", "allow_code_change", "allow_side_branch"))
    from testbed.run.dask_engine import SchedulerLost
    from testbed.run.resume import scheduler_lost_line

    try:
        return api.run(campaign, out, resume=resume, extend=extend, jobs=jobs,
                       backend=args.backend, workdir=workdir, console=out_console,
                       repeats=attempts.repeats, rerun_disturbed=attempts.rerun_disturbed,
                       host_lanes=args.host_lanes, allow_dirty=dirty,
                       allow_code_change=code_change, allow_side_branch=side,
                       calibration=getattr(args, "calibration", None), cluster=cluster,
                       tls=access_from(args) if cluster else None,
                       allow_mixed_backends=mixed)
    except SchedulerLost as exc:
        raise HostError(scheduler_lost_line(exc, campaign, Path(out), ARGV)) from None
    except UserError as exc:  # the flags' names, not the function's parameters
        if args.cluster and str(exc).startswith("cluster:"):
            raise UserError("--" + str(exc).replace("drop the cluster", "drop --cluster")
                            .replace("use jobs", "use --jobs N")) from None
        raise


def _ended(summary: Any) -> int:
    """Exit status 4 and one line per kind of trouble when units failed or the run
    could not remove what it made (testbed.run.failures rule 5); else exit status 5 and
    the first abort reasons when every episode of the run was aborted."""
    from testbed.run.failures import ending_lines

    lines = ending_lines(summary)
    aborted = _all_aborted(summary)
    for line in [*lines, *aborted]:
        print(line, file=sys.stderr)
    return EXIT_UNITS_FAILED if lines else EXIT_ALL_ABORTED if aborted else 0


#: Abort reasons ``testbed run`` names when every episode was aborted.
ABORT_REASONS_SHOWN = 3


def _all_aborted(summary: Any) -> list[str]:
    """One line per abort reason (the first :data:`ABORT_REASONS_SHOWN`, in the order
    the episodes were recorded) when this run ran episodes and every episode of its
    directory is aborted: nothing was measured, and exit status 0 would hide it."""
    path = Path(summary.out_dir) / "episodes.parquet"
    if summary.ran == 0 or summary.aborted < summary.ran or not path.exists():
        return []
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["aborted", "abort_reason"]).to_pylist()
    if not rows or not all(row["aborted"] for row in rows):
        return []
    reasons: dict[str, int] = {}
    for row in rows:
        text = " | ".join(line.strip() for line in str(row["abort_reason"] or "").splitlines()
                          if line.strip()) or "(no reason recorded)"
        reasons[text[:300]] = reasons.get(text[:300], 0) + 1
    every = f"all {len(rows)} episodes" if len(rows) != 1 else "the one episode"
    lines = [f"testbed run: {every} aborted, nothing was measured; reason ({count} "
             f"episode{'s' if count != 1 else ''}): {reason}"
             for reason, count in list(reasons.items())[:ABORT_REASONS_SHOWN]]
    if len(reasons) > ABORT_REASONS_SHOWN:
        lines[-1] += (f" (and {len(reasons) - ABORT_REASONS_SHOWN} more reasons: "
                      f"abort_reason in {path})")
    return lines


def cmd_report(args: argparse.Namespace) -> int:
    from testbed import api

    run_dir = Path(args.dir)
    if not (run_dir / "episodes.parquet").exists():
        raise UserError(f"{run_dir} has no episodes.parquet "
                        "(run a campaign into it first, or finish it with --resume)")
    out_console = console()
    if args.only_timeline and not args.timeline:
        raise UserError("--only-timeline: allowed only with --timeline")
    if args.timeline and args.episode is None:
        raise UserError("--timeline: needs --episode KEY (the folder names under "
                        f"{run_dir / 'history'}/ are the keys, with ~ for /)")
    if args.only_timeline:
        from testbed.report.timeline import timeline_figure

        paths = timeline_figure(run_dir, args.episode,
                                Path(args.out or run_dir) / "figures")
        out_console.print(f"report: timeline -> {', '.join(str(p) for p in paths)}")
        return 0
    summary = api.report(run_dir, draws=args.draws, seed=args.seed, console=out_console,
                         episode=args.episode, exclude_disturbed=args.exclude_disturbed,
                         out=args.out, timeline=args.timeline)
    out_console.print(f"report: {summary['report_md']} ({len(summary.get('tables', []))} "
                      f"tables, {len(summary.get('figures', []))} figures)")
    return 0


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-url", metavar="URL",
                   help="live campaigns: the endpoint's base URL ([model] base_url), e.g. "
                        "http://gpu1:8000/v1 (docs/live.md)")
    p.add_argument("--model", metavar="NAME",
                   help="live campaigns: the model name the server serves ([model] model)")


def _plugin_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import a policy plugin (a module on sys.path or a .py file) "
                             "before the campaign is read; every node imports it too")


def register(sub: Any) -> None:
    from testbed.links.backend import RUN_BACKEND_CHOICES as BACKENDS  # light: no registries

    p = sub.add_parser("check", help="validate a campaign and print its plan; creates nothing")
    p.add_argument("campaign", help="preset name or path to a campaign TOML file")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="lanes the wall-time estimate assumes (default: [execution] jobs, else 1)")
    p.add_argument("--templates", type=int, metavar="N", help="override the template count")
    p.add_argument("--backend", choices=list(BACKENDS), help="backend to plan for")
    p.add_argument("--repeats", type=positive_int, default=1, metavar="R",
                   help="repeats the expected resolution assumes (default 1)")
    _plugin_flag(p)
    _model_flags(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run a campaign (a preset name or a TOML file)")
    p.add_argument("campaign", help="preset name (demo, primary, rates, scope, density, reuse, "
                                    "teams, horizon) or path to a campaign TOML file")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan (cells, episodes, networks, wall-time "
                        "estimate) without creating anything")
    p.add_argument("--out", metavar="DIR", help="results directory (default results/<name>)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="finish an interrupted campaign without repeating finished "
                            "episodes")
    again.add_argument("--extend", action="store_true",
                       help="like --resume, for a campaign whose grid or templates have "
                            "grown (same name, seed and options; every old cell and "
                            "template kept)")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="run N topologies at once in this process (default: the "
                        "campaign's [execution] jobs, else 1; for emulated links, where "
                        "episodes wait on the link; loopback units always run alone)")
    p.add_argument("--host-lanes", type=positive_int, default=None, metavar="N",
                   help="lanes all `testbed run`s on this host may hold at once, as this "
                        "run counts them (default: $TESTBED_HOST_LANES, else 8 per CPU); "
                        "a loopback cell holds the whole host (docs/campaigns.md)")
    p.add_argument("--cluster", metavar="SPEC", type=cluster_spec,
                   help="run the work units on a dask cluster: local:N (N worker "
                        "processes here) or tls://HOST:PORT of a scheduler with `testbed "
                        "worker`s (default: the campaign's [execution] cluster, else here)")
    add_access_args(p)
    p.add_argument("--allow-dirty", action="store_true",
                   help="write into the repository's results/ from a checkout with "
                        "uncommitted changes (refused otherwise; the manifest records it)")
    p.add_argument("--allow-side-branch", action="store_true",
                   help="write into the repository's results/ from a revision main does "
                        "not contain (refused otherwise: its revision must stay reachable)")
    p.add_argument("--allow-code-change", action="store_true",
                   help="--resume/--extend with code other than the run's last session "
                        "(refused otherwise; each session and episode records its code)")
    p.add_argument("--allow-mixed-backends", action="store_true",
                   help="let cluster workers run shaped networks on different link backends")
    p.add_argument("--templates", type=int, metavar="N",
                   help="override the campaign's template count (quick looks)")
    p.add_argument("--backend", choices=list(BACKENDS),
                   help="link backend for the shaped networks (default: the campaign's "
                        "option, else auto); unshaped ones (loopback) never get one; sim: "
                        "every episode in virtual time, no root (docs/sim.md)")
    p.add_argument("--calibration", metavar="FILE",
                   help="--backend sim: the service times `testbed calibrate sim` wrote "
                        "(default: its default file)")
    p.add_argument("--workdir", metavar="DIR", help="where node stores and sockets live "
                                                    "(default: a fresh directory under /tmp)")
    add_precision_arguments(p)
    _plugin_flag(p)
    _model_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="tables, figures and report.md for a results directory")
    p.add_argument("dir", help="results directory written by `testbed run`")
    p.add_argument("--draws", type=positive_int, default=10_000,
                   help="bootstrap draws (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--episode", metavar="KEY",
                   help="draw the link plots (and with --timeline the timeline) of this "
                        "episode (default: the first episode with a link log of each "
                        "network)")
    p.add_argument("--timeline", action="store_true",
                   help="also draw --episode's space-time diagram from its history "
                        "(figures/timeline_<episode>.png and .svg, and in report.md/html)")
    p.add_argument("--only-timeline", action="store_true",
                   help="with --timeline: draw only the timeline (no tables, no bootstrap)")
    p.add_argument("--exclude-disturbed", action="store_true",
                   help="leave disturbed attempts out of every table (the report says how "
                        "many; an episode with no undisturbed attempt drops out with its "
                        "pairs)")
    p.add_argument("--out", metavar="DIR", type=Path,
                   help="write tables/, figures/ and report.md/html here (default: the "
                        "results directory)")
    p.set_defaults(func=cmd_report)
