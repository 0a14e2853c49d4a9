"""The ``testbed`` command line.

One module per group of sub-commands, each with a ``register(subparsers)`` that adds
its parsers (:data:`COMMAND_MODULES`); ``common`` holds what they share. Whose fault it
was decides how a failure ends (``testbed.errors``): bad user input is one line on
stderr and exit status 2; a host that lacks something is one line and exit status 3;
anything else is a bug in the testbed and shows its traceback (exit 1). An interrupt
(Ctrl-C, SIGTERM) ends ``run`` and ``exec`` with one line once what they built is removed:
exit status 130 for SIGINT, 143 for SIGTERM (``testbed.interrupts``).
``TESTBED_DEBUG=1`` shows the traceback of the first two kinds too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from testbed import interrupts
from testbed.cli import (
    bench,
    calibrate,
    campaigns,
    cluster,
    examples,
    history,
    info,
    maintenance,
    model,
    policies,
    precision,
    programs,
    reproduce,
    schema,
    simcheck,
    verify,
)
from testbed.cli.common import (
    ARGV,
    EXIT_HOST,
    EXIT_USER,
    OneLineParser,
    VersionAction,
    enter_requested_namespace,
)
from testbed.errors import HostError, UserError, one_line

#: Sub-command modules in the order `testbed --help` lists them.
COMMAND_MODULES = (info, examples, campaigns, precision, programs, policies, cluster, maintenance,
                   model, bench, calibrate, simcheck, verify, history, reproduce, schema)
#: Commands whose SIGINT and SIGTERM end them with one line once everything they built is
#: removed, exit status 128 + the signal (testbed.interrupts).
INTERRUPTIBLE = ("run", "exec")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="testbed",
        description="Coordination-cost testbed: PlanFence and baselines on real sockets "
                    "over emulated LTE links.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        enter_requested_namespace()  # before anything (numpy) starts a thread
    except HostError as exc:
        print(f"testbed: {one_line(exc)}", file=sys.stderr)
        return EXIT_HOST
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    with interrupts.handled(args.cmd in INTERRUPTIBLE):
        try:
            return func(args)
        except (KeyboardInterrupt, BaseExceptionGroup) as exc:
            if not interrupts.is_interrupt(exc):
                raise
            detail = f"; {exc.detail}" if isinstance(exc, interrupts.Interrupted) else ""
            print(f"testbed: interrupted{detail}", file=sys.stderr)
            return 128 + interrupts.signal_of(exc)
        except (UserError, HostError) as exc:
            if os.environ.get("TESTBED_DEBUG"):
                raise
            print(f"testbed {args.cmd}: {one_line(exc)}", file=sys.stderr)
            return EXIT_USER if isinstance(exc, UserError) else EXIT_HOST


if __name__ == "__main__":
    sys.exit(main())
