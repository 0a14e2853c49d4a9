"""``testbed worker``, ``testbed scheduler`` and ``testbed cluster certs``: a cluster a
lab runs (docs/cluster.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.common import console, positive_int


def add_access_args(p: argparse.ArgumentParser) -> None:
    """TLS and --insecure, as every cluster command takes them."""
    p.add_argument("--tls-ca-file", metavar="FILE", help="the lab's CA certificate (TLS)")
    p.add_argument("--tls-cert", metavar="FILE", help="this side's certificate (TLS)")
    p.add_argument("--tls-key", metavar="FILE", help="this side's private key (TLS)")
    p.add_argument("--cluster-config", metavar="FILE",
                   help="a TOML file whose [cluster] section names tls_ca_file, tls_cert "
                        "and tls_key (`testbed cluster certs` writes one per role)")
    p.add_argument("--insecure", action="store_true",
                   help="allow plain tcp:// beyond this host (unencrypted, unauthenticated)")


def access_from(args: argparse.Namespace) -> Any:
    from testbed.run.cluster_security import cluster_access

    return cluster_access(tls_ca_file=args.tls_ca_file, tls_cert=args.tls_cert,
                          tls_key=args.tls_key, config=args.cluster_config,
                          insecure=args.insecure)


def _timedelta(text: str) -> float:
    from dask.utils import parse_timedelta

    try:
        value = parse_timedelta(text, default="seconds")
    except (ValueError, KeyError, TypeError):
        value = None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: a duration "
                                         "such as 60, 60s or 5m")
    return float(value)


def _memory(text: str) -> str:
    from dask.utils import parse_bytes

    if text == "auto":
        return text
    try:
        if float(text) >= 0:
            return text
    except ValueError:
        pass
    try:
        parse_bytes(text)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: auto, a "
                                         "fraction of the host's memory (0.5), bytes or a "
                                         "size such as 4GiB; 0 for no limit") from None
    return text


def _protocol(text: str) -> str:
    """dask's --protocol: tcp or tls, also written tls:// (as dask-jobqueue does)."""
    name = text.removesuffix("://")
    if name not in ("tcp", "tls"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: tcp, tls")
    return name


def _resources(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.replace(",", " ").split():
        name, eq, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            eq = ""
        if not eq or not name or out.get(name, -1) < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: NAME=COUNT "
                                             "pairs such as 'lanes=4 GPU=1'")
    return out


def cmd_worker(args: argparse.Namespace) -> int:
    from testbed.tools.worker import WorkerOptions, run_worker

    resources = dict(args.resources or {})
    lanes = args.lanes or int(resources.pop("lanes", 0)) or args.nthreads or 1
    resources.pop("lanes", None)
    options = WorkerOptions(
        args.scheduler, lanes=lanes, nthreads=max(args.nthreads or lanes, lanes),
        name=args.name, nworkers=args.nworkers, memory_limit=args.memory_limit,
        death_timeout_s=args.death_timeout, local_directory=args.local_directory,
        resources=resources, listen=args.listen, interface=args.interface,
        protocol=args.protocol, nanny=args.nanny, dashboard=args.dashboard,
        dashboard_address=args.dashboard_address, lifetime=args.lifetime,
        lifetime_stagger=args.lifetime_stagger, lifetime_restart=args.lifetime_restart,
        access=access_from(args), loopback_only=args.loopback_only)
    return run_worker(options, console=console())


def cmd_scheduler(args: argparse.Namespace) -> int:
    from testbed.tools.scheduler import SchedulerOptions, run_scheduler

    return run_scheduler(SchedulerOptions(
        port=args.port, listen=args.listen, interface=args.interface,
        dashboard=args.dashboard, dashboard_address=args.dashboard_address,
        access=access_from(args)), console=console())


def cmd_certs(args: argparse.Namespace) -> int:
    from testbed.tools.certs import make_certs

    hosts = [h for h in (args.hosts or "").split(",") if h]
    written = make_certs(Path(args.dir), hosts=hosts, lab=args.lab, days=args.days,
                         force=args.force)
    out = console()
    for path in written:
        out.print(f"wrote {path}", markup=False)
    out.print(f"certs: copy ca.pem and the role's .pem, .key and .toml to each host; keep "
              f"{Path(args.dir) / 'ca.key'} private", markup=False)
    return 0


def _worker_parser(sub: Any) -> None:
    from testbed.run.cluster_security import DEFAULT_DEATH_TIMEOUT_S

    p = sub.add_parser("worker", help="serve this host as a dask worker for campaigns")
    p.add_argument("scheduler", help="scheduler address, e.g. tls://10.0.0.1:8786")
    p.add_argument("--lanes", type=positive_int, default=None, metavar="N",
                   help="work units each worker process runs at once (default: a lanes= "
                        "resource, else --nthreads, else 1)")
    p.add_argument("--nthreads", type=positive_int, default=None, metavar="N",
                   help="threads per worker process (dask's; default: the lanes)")
    p.add_argument("--nworkers", type=positive_int, default=1, metavar="N",
                   help="worker processes on this host (dask's; default 1)")
    p.add_argument("--name", help="worker name (default: dask's)")
    p.add_argument("--memory-limit", type=_memory, default="auto", metavar="LIMIT",
                   help="memory limit per worker process (dask's; default auto)")
    p.add_argument("--death-timeout", type=_timedelta, default=DEFAULT_DEATH_TIMEOUT_S,
                   metavar="SECONDS",
                   help="how long to wait for a (restarted) scheduler before exiting "
                        f"(default {DEFAULT_DEATH_TIMEOUT_S:g})")
    p.add_argument("--local-directory", metavar="DIR", help="dask's scratch directory")
    p.add_argument("--resources", type=_resources, metavar="'NAME=N ...'",
                   help="dask resources (lanes=N sets the lanes)")
    p.add_argument("--listen", metavar="ADDRESS",
                   help="address to listen on (default 127.0.0.1: give this host's "
                        "address when the scheduler is elsewhere)")
    p.add_argument("--interface", metavar="NAME", help="listen on this interface's address")
    p.add_argument("--protocol", type=_protocol, metavar="tcp|tls",
                   help="protocol to listen with (default: tls with certificates)")
    p.add_argument("--nanny", action=argparse.BooleanOptionalAction, default=True,
                   help="run each worker under a nanny that restarts it (default on)")
    p.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=False,
                   help="serve the worker's dashboard (default off; on 127.0.0.1)")
    p.add_argument("--dashboard-address", metavar="HOST:PORT",
                   help="where the worker's HTTP endpoint listens (default 127.0.0.1:0)")
    p.add_argument("--lifetime", metavar="DURATION", help="close after this long (dask's)")
    p.add_argument("--lifetime-stagger", default="0 seconds", metavar="DURATION",
                   help="random spread of --lifetime (dask's)")
    p.add_argument("--lifetime-restart", action=argparse.BooleanOptionalAction, default=False,
                   help="restart after --lifetime (dask's)")
    p.add_argument("--loopback-only", action="store_true",
                   help="serve even if no link backend works (loopback campaigns only)")
    add_access_args(p)
    p.set_defaults(func=cmd_worker)


def register(sub: Any) -> None:
    _worker_parser(sub)

    p = sub.add_parser("scheduler", help="a dask scheduler for campaigns, secure by default")
    p.add_argument("--port", type=int, default=8786, help="port (default 8786)")
    p.add_argument("--listen", metavar="ADDRESS", help="address (default 127.0.0.1)")
    p.add_argument("--interface", metavar="NAME", help="listen on this interface's address")
    p.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=False,
                   help="serve dask's dashboard (default off; on 127.0.0.1:8787)")
    p.add_argument("--dashboard-address", metavar="HOST:PORT",
                   help="where the HTTP endpoint listens (default 127.0.0.1)")
    add_access_args(p)
    p.set_defaults(func=cmd_scheduler)

    p = sub.add_parser("cluster", help="a lab's cluster: certificates")
    csub = p.add_subparsers(dest="cluster_cmd", required=True, metavar="WHICH")
    c = csub.add_parser("certs", help="create a CA and scheduler, worker and client "
                                      "certificates for mutual TLS")
    c.add_argument("dir", help="directory to write them to (an existing CA there is reused)")
    c.add_argument("--hosts", metavar="H1,H2", help="host names or addresses to name in "
                                                    "the certificates")
    c.add_argument("--lab", default="lab", help="a name for the CA (default lab)")
    c.add_argument("--days", type=positive_int, default=365, help="validity (default 365)")
    c.add_argument("--force", action="store_true", help="replace existing role certificates")
    c.set_defaults(func=cmd_certs)
