"""What every sub-command shares: exit codes, argument types, the console, privileges.

Whose fault it was decides how a failure ends (``testbed.errors``): bad user input is
one line on stderr and exit status 2; a host that lacks something is one line and exit
status 3; a campaign whose units failed ends with a one-line summary and exit status 4,
one whose every episode was aborted with its first abort reasons and exit status 5; an
interrupt (Ctrl-C, SIGTERM) of ``run`` or ``exec`` ends with one line and exit status
130 or 143 (``testbed.interrupts``); anything else is a bug in the testbed and shows its
traceback (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from testbed.errors import HostError, UserError

if TYPE_CHECKING:  # rich is imported when a console is made: `exec` and `shell` need none
    from rich.console import Console

DEFAULT_RESULTS = Path("results")
EXIT_USER, EXIT_HOST = 2, 3
EXIT_UNITS_FAILED = 4
"""``testbed run`` finished, but units of it failed (testbed.run.failures): a one-line
summary says how many and why; their episodes are recorded as aborted."""
EXIT_ALL_ABORTED = 5
"""``testbed run`` finished, but every episode of the run is aborted: nothing was
measured. One line per abort reason (at most 3) says why."""

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
                        "run it as root")


def check_namespaces(what: str) -> None:
    """Root, or unprivileged user namespaces that work here; else the one-line HostError
    :func:`require_namespaces` would raise (without re-executing anything)."""
    if os.geteuid() == 0:
        return
    from testbed.host.userns import probe

    works, detail = probe()
    if not works:
        raise HostError(f"{what} needs root or unprivileged user namespaces ({detail}); "
                        "run it as root")


def require_namespaces(what: str) -> None:
    """Root, or else a user namespace of our own (a rootless run, testbed.host.userns).

    The kernel gives a user namespace only to a single-threaded process, and by now
    numpy's libraries have started threads: so the command re-executes itself, and the
    fresh process enters the namespace first thing (``main``).
    """
    if os.geteuid() == 0:
        return
    check_namespaces(what)
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


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the usage itself is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _blocking_file(path: Path) -> Path | None:
    """The first existing ancestor of PATH (or PATH) that is not a directory."""
    for candidate in (*reversed(path.parents), path):
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return None


def directory(flag: str, text: str | None) -> Path | None:
    """A directory flag's value: absent, an existing directory, or a path to create."""
    if text is None:
        return None
    if not text.strip():
        raise UserError(f"{flag}: empty; allowed: a directory (existing or to be created)")
    path = Path(text)
    blocking = _blocking_file(path)
    if blocking == path:
        raise UserError(f"{flag}: {text} is not a directory; allowed: a directory "
                        "(existing or to be created)")
    if blocking is not None:
        raise UserError(f"{flag}: {text} cannot be a directory: {blocking} is a file; "
                        "allowed: a directory (existing or to be created)")
    return path


#: File formats a figure may be written in (the extension decides; matplotlib's Agg).
PLOT_FORMATS = ("png", "pdf", "svg")


def output_file(flag: str, suffixes: tuple[str, ...] | None = None,
                ) -> Callable[[str], Path]:
    """argparse type for a file the command writes: not a directory, no file in the way
    of its folder (created when written), one of SUFFIXES if given."""
    def check(text: str) -> Path:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{flag}: empty; allowed: a file to write")
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory; allowed: a file to "
                                             "write")
        blocking = _blocking_file(path.parent)
        if blocking is not None:
            raise argparse.ArgumentTypeError(f"{text}: {blocking} is a file, not a folder")
        if suffixes is not None and path.suffix.lower().lstrip(".") not in suffixes:
            raise argparse.ArgumentTypeError(
                f"{text}: format {path.suffix or '(none)'!r} is not allowed; allowed: "
                + ", ".join(f".{s}" for s in suffixes))
        return path
    return check


def cluster_spec(text: str) -> str:
    """argparse type for ``--cluster`` (the campaign's own rule for ``[execution]``)."""
    from testbed.campaign.vocabulary import CLUSTER_ALLOWED, CLUSTER_SPEC

    if not CLUSTER_SPEC.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: {CLUSTER_ALLOWED}")
    return text


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
