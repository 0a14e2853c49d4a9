"""``testbed examples list|copy NAME DIR``: the worked examples shipped with the testbed.

Each example is a folder (a campaign file, its own traces, the script that wrote them)
that runs as is from anywhere: its campaign names its files relative to itself. The
folders are ``docs/examples/`` in a checkout and ``testbed/examples/`` in an installed
wheel (pyproject.toml ships the one as the other); :func:`examples_dir` finds either.
``copy`` puts one into a folder of the user's, so that its runs and edits stay there
and never in the checkout or the installed package.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from testbed.errors import UserError


class ExampleError(UserError):
    """An example name or a target folder the user gave is unusable."""


def examples_dir() -> Path:
    """``testbed/examples`` of an installed wheel, else the checkout's ``docs/examples``."""
    installed = Path(__file__).resolve().parents[1] / "examples"
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / "docs" / "examples"


def example_names() -> list[str]:
    folder = examples_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "campaign.toml").is_file())


def example_path(name: str) -> Path:
    names = example_names()
    if name not in names:
        raise ExampleError(f"example: {name!r} is not one of {', '.join(names) or '(none)'}"
                           " (`testbed examples list`)")
    return examples_dir() / name


def describe(name: str) -> str:
    """The example campaign's own ``description``."""
    data = tomllib.loads((example_path(name) / "campaign.toml").read_text())
    return str(data.get("description", ""))


def copy_example(name: str, target: Path) -> Path:
    """Copy example NAME into TARGET (a new or empty folder); returns the campaign file."""
    source = example_path(name)
    if target.exists() and not target.is_dir():
        raise ExampleError(f"DIR: {target} is a file; allowed: a new or empty folder")
    if target.is_dir() and any(target.iterdir()):
        raise ExampleError(f"DIR: {target} is not empty; allowed: a new or empty folder "
                           "(nothing is overwritten)")
    missing = next((p for p in target.parents if p.exists()), None)
    if missing is not None and not missing.is_dir():
        raise ExampleError(f"DIR: {missing} is a file, so {target} cannot be made")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target / "campaign.toml"
