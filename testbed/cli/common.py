"""What every sub-command shares: exit codes, argument types, the console, privileges.

Whose fault it was decides how a failure ends (``testbed.errors``): bad user input is
one line on stderr and exit status 2; a host that lacks something is one line and exit
status 3; a campaign whose units failed ends with a one-line summary and exit status 4;
anything else is a bug in the testbed and shows its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.errors import HostError, UserError

if TYPE_CHECKING:  # rich is imported when a console is made: `exec` and `shell` need none
    from rich.console import Console

DEFAULT_RESULTS = Path("results")
EXIT_USER, EXIT_HOST = 2, 3
EXIT_UNITS_FAILED = 4
"""``testbed run`` finished, but units of it failed (testbed.run.failures): a one-line
summary says how many and why; their episodes are recorded as aborted."""

USERNS_ENV = "TESTBED_IN_NEW_USERNS"
"""Set when ``testbed`` re-executes itself to start inside a user namespace of its own."""
ARGV: list[str] = []
"""The command line ``main`` was given (a rootless re-execution repeats it)."""


def version() -> str:
    from importlib import metadata  # only when asked: it costs every command 0.1 s

    try:
        return metadata.version("planfence-testbed")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise HostError(f"{what} needs root (network namespaces and TUN devices); "
                        "run it as root or with sudo")


def require_namespaces(what: str) -> None:
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
    os.execv(sys.executable, [sys.executable, "-m", "testbed", *ARGV])


def enter_requested_namespace() -> None:
    if os.environ.pop(USERNS_ENV, None) != "1":
        return
    from testbed.host.userns import enter_user_namespace

    enter_user_namespace()


def positive_int(text: str) -> int:
    """argparse type for counts: a one-line error naming what is allowed."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 1")
    return value


def counts(text: str) -> tuple[int, ...]:
    """argparse type for a comma-separated list of counts >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: counts >= 1, "
                                         "comma-separated (e.g. 1,2,4)")
    return values


def directory(flag: str, text: str | None) -> Path | None:
    """A directory flag's value: absent, an existing directory, or a path to create."""
    if text is None:
        return None
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {text} is not a directory; allowed: a directory "
                        "(existing or to be created)")
    return path


def console() -> Console:
    from rich.console import Console

    # Piped output (CI logs, `| tee`) gets a wide console so tables are not truncated.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help=help or "show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"testbed {version()}")
        parser.exit()
