"""Provenance of a run: package versions, the lock file, the git revision, the host."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from testbed.results.cpu_speed import cpu_model

SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this code runs from (site-packages for a wheel install: no git, no lock)."""
LOCK_NAME = "requirements.lock"
_PACKAGES = ("planfence-testbed", "trio", "pyroute2", "msgpack", "PyNaCl", "cryptography",
             "numpy", "pandas", "pyarrow", "rich", "pydantic")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_revision(repo: Path | None = None) -> dict[str, Any]:
    """HEAD of the checkout this code runs from (read-only git calls), else "unknown"."""
    where = repo or SOURCE_ROOT
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, check=True,
                               timeout=10).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"revision": "unknown", "dirty": None}
    return {"revision": rev or "unknown", "dirty": dirty}


def host_description() -> dict[str, Any]:
    u = os.uname()
    return {"host": socket.gethostname(), "kernel": f"{u.sysname} {u.release} {u.version}",
            "machine": u.machine, "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "cpus": os.cpu_count(),
            "cpu_model": cpu_model()}


def lock_file(root: Path | None = None) -> dict[str, Any]:
    """The dependency lock the environment was installed from: path and SHA-256."""
    path = (root or SOURCE_ROOT) / LOCK_NAME
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return {"path": None, "sha256": None}
    return {"path": str(path), "sha256": digest}
