"""``testbed bench WHICH``: the benchmarks whose figures go to docs/benchmarks.md.

Each benchmark is one row of :data:`BENCHES`: its name, its help, its own options and
the function that runs it. A runner writes ``--json`` itself and returns what to print
as JSON, or None when it printed its own table.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.cli.common import (
    console,
    counts,
    output_file,
    positive_int,
    require_namespaces,
    require_root,
)
from testbed.errors import UserError

if TYPE_CHECKING:  # rich is imported when a benchmark runs, not by every command
    from rich.console import Console


def write_json(path: Path | None, result: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")


def _unless_written(path: Path | None, result: Any) -> Any:
    return result if path is None else None


def _rpc(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    from testbed.tools.bench_rpc import run_bench

    result = run_bench()
    write_json(json_path, result)
    return result


def _link(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    require_namespaces("bench link")
    from testbed.tools.bench_link import bench_link

    result = trio.run(partial(bench_link, json_path, out, backend=args.backend,
                              order=args.order))
    return _unless_written(json_path, result)


def _link_args(b: argparse.ArgumentParser) -> None:
    from testbed.links.linkspec import ORDERS

    b.add_argument("--backend", choices=["userspace", "netem"], default="userspace",
                   help="link backend to measure (default userspace)")
    b.add_argument("--order", choices=ORDERS, default=None,
                   help="every link's order (default: each network's own, link_then_delay); "
                        "mahimahi puts the downlink's delay first, as mm-delay outside "
                        "mm-link")


def _episode(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    from testbed.tools.bench_episode import bench_episode

    result = trio.run(lambda: bench_episode(json_path, out, loopback_only=args.loopback_only))
    return _unless_written(json_path, result)


def _episode_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--loopback-only", action="store_true",
                   help="only the loopback cells (skip the AT&T cell run as root)")


def _limits(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    if args.network != "loopback":
        require_root(f"bench limits --network {args.network}")
    from testbed.tools.bench_limits import bench_limits

    result = trio.run(lambda: bench_limits(
        out, network=args.network, templates=args.templates,
        policies=args.policies.split(",") if args.policies else (), preset=args.preset))
    write_json(json_path, result)
    return None  # the table is printed


def _limits_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--network", default="loopback",
                   help="network of the preset's grid to run (default loopback)")
    b.add_argument("--preset", default="primary",
                   help="the preset whose grid to run (default primary; artifact has the "
                        "largest records)")
    b.add_argument("--templates", type=positive_int, default=1, metavar="N",
                   help="templates per cell (default 1)")
    b.add_argument("--policies", metavar="P1,P2",
                   help="only these policies (default: every policy of the preset)")


def _lanes(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    require_namespaces("bench lanes")
    from testbed.tools.bench_lanes import bench_lanes

    result = trio.run(lambda: bench_lanes(json_path, out, lanes=args.lanes,
                                          workers=args.workers, templates=args.templates,
                                          emulator=args.emulator))
    return _unless_written(json_path, result)


def _worker_counts(text: str) -> tuple[int, ...]:
    """``counts``, or ``none`` for no LocalCluster rows."""
    return () if text.strip().lower() == "none" else counts(text)


def _lanes_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--lanes", type=counts, default=(1, 2, 4, 8, 16), metavar="N,N",
                   help="local lane counts (default 1,2,4,8,16)")
    b.add_argument("--workers", type=_worker_counts, default=(1, 2, 4), metavar="N,N",
                   help="LocalCluster worker counts (default 1,2,4; none: local lanes only)")
    b.add_argument("--templates", type=positive_int, default=None, metavar="N",
                   help="templates (units) per run (default: the largest count)")
    b.add_argument("--emulator", choices=("shared", "per-lane"), default="shared",
                   help="one emulator for every lane (default) or one per lane")


def _cluster(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    require_root("bench cluster")
    from testbed.tools.bench_cluster import bench_cluster

    result = bench_cluster(json_path, out, workers=args.workers, lanes=args.lanes,
                           templates=args.templates, units=args.units,
                           keep=Path(args.keep) if args.keep else None)
    return _unless_written(json_path, result)


def _cluster_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--workers", type=counts, default=(1, 2, 4), metavar="N,N",
                   help="worker hosts per run (default 1,2,4)")
    b.add_argument("--lanes", type=positive_int, default=1, metavar="N",
                   help="lanes per worker, and of the local run (default 1)")
    b.add_argument("--templates", type=positive_int, default=8, metavar="N",
                   help="templates, so units, of the campaign (default 8)")
    b.add_argument("--units", type=positive_int, default=12, metavar="N",
                   help="actions per episode (default 12)")
    b.add_argument("--keep", metavar="DIR", help="keep the runs and logs in DIR")


def _transfer(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    from testbed.tools.bench_transfer import (
        bench_transfer,
        role_call_reference,
        write_transfer,
    )

    out_dir = Path(args.out or "results/transfer")
    reference = role_call_reference(
        role_call_ms=args.role_call_ms,
        live_run=None if args.role_calls is None else Path(args.role_calls))
    if args.redraw:  # the figure again from the measured samples, with this line
        measured = out_dir / "transfer.json"
        if not measured.is_file():
            raise UserError(f"--redraw: no {measured} to draw from (run the benchmark "
                            f"first, or name its directory with --out)")
        result = {**json.loads(measured.read_text()), "reference": reference}
    else:
        require_namespaces("bench transfer")
        result = trio.run(lambda: bench_transfer(out, samples=args.samples,
                                                 reference=reference))
    paths = write_transfer(result, out_dir)
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    out.print("transfer: " + ", ".join(map(str, paths)))
    return None


def _transfer_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--out", metavar="DIR",
                   help="where transfer.json and fig_c1.png go (default results/transfer)")
    b.add_argument("--samples", type=positive_int, default=20, metavar="N",
                   help="transfers per payload size and loss rate (default 20)")
    b.add_argument("--role-call-ms", type=float, metavar="MS",
                   help="a median model role-call duration: the figure's reference line "
                        "at 10%% of it (the paper's calibration: 1170)")
    b.add_argument("--role-calls", metavar="RUN",
                   help="a live run's results directory: the reference line at 10%% of "
                        "its median role call")
    b.add_argument("--redraw", action="store_true",
                   help="measure nothing: draw the figure again from --out's "
                        "transfer.json with the reference line given")


def _examples(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    require_root("bench examples")
    from testbed.tools.bench_examples import bench_examples

    bench_examples(json_path, out, names=args.names.split(",") if args.names else None)
    return None  # the table is printed


def _examples_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--names", metavar="N1,N2",
                   help="only these examples (default: every one, `testbed examples list`)")


def _exec(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    require_root("bench exec")
    from testbed.tools.bench_exec import bench_exec

    bench_exec(json_path, out, repeats=args.repeats, hosts=args.hosts)
    return None  # the table is printed


def _exec_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--repeats", type=positive_int, default=5, metavar="N",
                   help="runs per network size (default 5)")
    b.add_argument("--hosts", type=counts, default=(2, 8), metavar="N,N",
                   help="network sizes (default 2,8)")


def _disturbance(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import os

    if "fixed" in args.networks:
        require_namespaces("bench disturbance")
    if len(os.sched_getaffinity(0)) < 2:
        raise UserError("bench disturbance: needs two CPUs (the nodes and the busy "
                        "processes share one, the controller keeps the other)")
    from testbed.tools.bench_disturbance import bench_disturbance

    bench_disturbance(json_path, out, networks=args.networks, templates=args.templates,
                      rounds=args.rounds, write=args.write_calibration)
    return None  # the table is printed


def _disturbance_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--networks", type=lambda text: [n for n in text.split(",") if n],
                   default=["loopback", "fixed"], metavar="N1,N2",
                   help="networks to measure (default loopback,fixed)")
    b.add_argument("--templates", type=positive_int, default=3, metavar="N",
                   help="schedules per round (default 3)")
    b.add_argument("--rounds", type=positive_int, default=2, metavar="N",
                   help="rounds of every arm (default 2)")
    b.add_argument("--write-calibration", action="store_true",
                   help="write the fit into the disturbance verdict's calibration file")


def _calibrate(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    require_namespaces("bench calibrate")
    from testbed.tools.calibrate import calibrate

    cal = trio.run(partial(calibrate, args.backend, runs=args.runs))
    result = {"backend": args.backend, **cal.as_dict()}
    out.print(f"calibrate {args.backend}: {cal.describe()}")
    write_json(json_path, result)
    return _unless_written(json_path, result)


def _calibrate_args(b: argparse.ArgumentParser) -> None:
    _link_args(b)
    b.add_argument("--runs", type=positive_int, default=5, metavar="N",
                   help="streams to measure (default 5)")


def _model(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    import trio

    from testbed.tools.bench_model import bench_model

    if args.role_calls is not None:
        from testbed.tools.role_call_stats import run_role_call_stats

        result: Any = {"role_calls": run_role_call_stats(args.role_calls)}
    elif args.real is not None:
        from testbed.tools.bench_model_real import bench_real

        result = trio.run(lambda: bench_real(out, model=args.real, calls=args.calls or 20,
                                             templates=args.templates))
    else:
        result = trio.run(lambda: bench_model(out, calls=args.calls or 200,
                                              templates=args.templates or 6,
                                              latency=args.latency))
    write_json(json_path, result)
    return result


def _model_args(b: argparse.ArgumentParser) -> None:
    from testbed.tools.llama_process import BUNDLED

    b.add_argument("--calls", type=positive_int, default=None, metavar="N",
                   help="role calls for the overhead figure (default 200; with --real, "
                        "role calls to the real model, default 20)")
    b.add_argument("--templates", type=positive_int, default=None, metavar="N",
                   help="tasks per arm of the live preset run (default 6; with --real, "
                        "no preset run unless given)")
    b.add_argument("--real", choices=list(BUNDLED), default=None,
                   help="start this real model (as testbed model-server --model starts it) "
                        "and measure role calls against it: latency p50/p95, prompt and "
                        "completion tokens/s, schema failures (needs the model extra)")
    b.add_argument("--role-calls", metavar="RUN", default=None,
                   help="no server: the same role-call statistics from a committed live "
                        "run's recorded decisions")
    b.add_argument("--latency", default="calibrated",
                   help="the stand-in's latency for the preset run: calibrated (default), "
                        "matched, zero or seconds")


def _history(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    from testbed.tools.bench_history import bench_history

    result = bench_history(args.events)
    write_json(json_path, result)
    return result


def _history_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--events", type=positive_int, default=1_000_000, metavar="N",
                   help="events in the synthetic history (default 1000000)")


def _sim(args: argparse.Namespace, out: Console, json_path: Path | None) -> Any:
    from testbed.sim.bench import SIZES, bench_sim
    from testbed.sim.calibration import load

    calibration = load(None if args.calibration is None else Path(args.calibration))
    try:
        result = bench_sim(calibration, sizes=args.agents or SIZES, policy=args.policy,
                           network=args.network, connection=args.connection)
    except UserError as exc:  # the cell's grid field is the flag of the same name
        raise UserError(str(exc).replace("grid.", "--", 1)) from None
    write_json(json_path, result)
    return result


def _sim_args(b: argparse.ArgumentParser) -> None:
    # the default sizes are the bench's own (testbed.sim.bench.SIZES), read when it runs:
    # importing the simulator to register a flag would slow every command down
    b.add_argument("--agents", type=counts, default=None, metavar="N,N",
                   help="team sizes, one episode each (default: the bench's, 5 to 10000)")
    b.add_argument("--policy", default="planfence", help="the cell's policy (default "
                   "planfence)")
    b.add_argument("--network", default="att", help="the cell's network (default att)")
    b.add_argument("--connection", default="fresh", help="the cell's connection setting "
                   "(default fresh)")
    b.add_argument("--calibration", metavar="FILE",
                   help="service times (default: what `testbed calibrate sim` wrote)")


BenchRun = Callable[[argparse.Namespace, "Console", "Path | None"], Any]


@dataclass(frozen=True)
class Bench:
    name: str
    help: str
    run: BenchRun
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


BENCHES: tuple[Bench, ...] = (
    Bench("rpc", "owner-head RPC latency and install latency on loopback", _rpc),
    Bench("link", "request/response over emulated links vs prediction", _link, _link_args),
    Bench("episode", "PlanFence stall per action on loopback, fresh vs reuse", _episode,
          _episode_args),
    Bench("limits", "the primary grid's peak connections, objects and installs against the "
                    "node limits", _limits, _limits_args),
    Bench("lanes", "AT&T episodes at 1-16 lanes and on a LocalCluster", _lanes, _lanes_args),
    Bench("cluster", "a campaign on a scheduler and 1, 2, 4 worker hosts (network namespaces "
                     "on one bridge, TLS) against a local run", _cluster, _cluster_args),
    Bench("exec", "testbed exec: from the call to the command's first instruction, and from "
                  "its exit to everything removed (2 and 8 hosts)", _exec, _exec_args),
    Bench("disturbance", "stall change per ms of the nodes' run-queue wait (busy processes "
          "beside a team), the disturbance verdict's sensitivity", _disturbance,
          _disturbance_args),
    Bench("calibrate", "how fast this machine moves full-size datagrams over an unshaped "
                       "link (what rate checks may demand of it)", _calibrate,
          _calibrate_args),
    Bench("transfer", "one fresh authenticated transfer against payload and loss on a wired, "
                      "an LTE and a LEO-like network (fig. C.1)", _transfer, _transfer_args),
    Bench("examples", "each bundled example run as a user runs it, its wall time against "
                      "`testbed check`'s estimate", _examples, _examples_args),
    Bench("model", "role-call overhead against the stand-in model server, and the live "
                   "preset's wall time per attempt at the calibrated latency; --real: "
                   "role-call latency and tokens/s against a real model", _model,
          _model_args),
    Bench("history", "the history checker's throughput (events/s) and peak memory on a "
                     "seeded synthetic history", _history, _history_args),
    Bench("sim", "one simulated episode per team size (5 to 10,000 agents): wall time and "
                 "memory per member", _sim, _sim_args),
)


def cmd_bench(args: argparse.Namespace) -> int:
    out = console()
    bench = next(b for b in BENCHES if b.name == args.bench_cmd)
    if args.json is not None:  # its folder, before minutes of measuring
        args.json.parent.mkdir(parents=True, exist_ok=True)
    result = bench.run(args, out, args.json)
    if result is not None:
        out.print_json(json.dumps(result, default=str))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (figures go to docs/benchmarks.md)")
    bsub = p.add_subparsers(dest="bench_cmd", required=True, metavar="WHICH")
    for bench in BENCHES:
        b = bsub.add_parser(bench.name, help=bench.help)
        b.add_argument("--json", metavar="FILE", type=output_file("--json"),
                       help="also write the figures as JSON")
        if bench.add_arguments is not None:
            bench.add_arguments(b)
    p.set_defaults(func=cmd_bench)
