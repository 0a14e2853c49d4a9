"""``testbed doctor``, ``testbed traces`` and ``testbed networks``: what this host and
the link catalogue offer."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from testbed.cli.common import EXIT_HOST, PLOT_FORMATS, console, output_file


def cmd_doctor(args: argparse.Namespace) -> int:
    """The table of probes; a problem that fails every campaign (a broken installed
    policy plugin) is also one line on stderr and exit status 3. What this host's kernel
    cannot do is no such problem: the table says which backend runs instead."""
    from testbed.tools.doctor import FATAL_CHECKS, render_doctor, run_doctor

    checks = run_doctor()
    render_doctor(checks, console())
    problems = [c for c in checks if c.name in FATAL_CHECKS and not c.ok]
    for check in problems:
        print(f"testbed doctor: problem: {check.name}: {check.detail}", file=sys.stderr)
    return EXIT_HOST if problems else 0


def cmd_traces(args: argparse.Namespace) -> int:
    from testbed.tools.traces_view import traces_list, traces_show

    if args.traces_cmd == "list":
        traces_list(console())
    else:
        traces_show(args.name, args.plot, console(),
                    direction=args.direction)
    return 0


def cmd_networks(args: argparse.Namespace) -> int:
    from testbed.tools.networks_view import networks_list, networks_show

    if args.networks_cmd == "list":
        networks_list(console(), campaign=args.campaign)
    else:
        networks_show(args.name, console(), campaign=args.campaign,
                      plot=args.plot)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="probe which kernel features and link backends work here")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("traces", help="list or show the shipped LTE capacity traces")
    tsub = p.add_subparsers(dest="traces_cmd", required=True, metavar="ACTION")
    tsub.add_parser("list", help="table of traces: length, mean capacity, longest outage")
    show = tsub.add_parser("show", help="summary of one trace, optionally a capacity plot")
    show.add_argument("name", help="a shipped trace's name (e.g. ATT-LTE-driving.up) or a "
                                   "trace file's path")
    show.add_argument("--direction", choices=["up", "down"],
                      help="the direction of a file not named *.up / *.down")
    show.add_argument("--plot", metavar="FILE.png", type=output_file("--plot", PLOT_FORMATS),
                      help="write capacity over time to FILE (.png, .pdf or .svg)")
    p.set_defaults(func=cmd_traces)

    p = sub.add_parser("networks", help="list or show the networks a campaign can name")
    nsub = p.add_subparsers(dest="networks_cmd", required=True, metavar="ACTION")
    nlist = nsub.add_parser("list", help="every network: base RTT, capacity, longest outage")
    nlist.add_argument("--campaign", metavar="FILE", help="also the networks FILE defines")
    nshow = nsub.add_parser("show", help="one network resolved: its definition, links, RTTs")
    nshow.add_argument("name", help="a network name (see `testbed networks list`)")
    nshow.add_argument("--campaign", metavar="FILE", help="look in FILE's [networks] too")
    nshow.add_argument("--plot", metavar="FILE.png", type=output_file("--plot", PLOT_FORMATS),
                       help="write its capacity and delay over time (.png, .pdf or .svg)")
    p.set_defaults(func=cmd_networks)
