"""Provenance of a run: package versions, the lock file, the git revision, the code, the host.

The code a run executed is named by a digest of its product code (``protocols/``,
``nodes/``, ``testbed/``): SHA-256 over each file's path and git blob id, in path
order. The same digest is computed from a working tree (every tracked or untracked,
not ignored file there) and from any committed revision (``git ls-tree``), so a run's
recorded digest can be checked against the revision it names, and two sessions of one
run (``--resume``, ``--extend``) can be told to have run the same code or not.
"""

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
#: The product code whose digest a run records (tests, docs, results and scripts are not).
CODE_PATHS: tuple[str, ...] = ("protocols", "nodes", "testbed")
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


def _git(args: list[str], where: Path, *, text: bool = True) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(["git", *args], cwd=where, capture_output=True, text=text,
                          check=True, timeout=60)


def _blob_id(data: bytes) -> str:
    """The id git gives a file's content (SHA-1 of ``blob <size>\\0<content>``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _digest(entries: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for path, blob in sorted(entries):
        h.update(f"{path}\0{blob}\n".encode())
    return "sha256:" + h.hexdigest()


def code_digest(repo: Path | None = None) -> str | None:
    """The product code's digest as it is on disk now (None: not a git checkout)."""
    where = repo or SOURCE_ROOT
    try:
        out = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                    *CODE_PATHS], where).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    entries = []
    for name in sorted(set(filter(None, out.split("\0")))):
        path = where / name
        if path.is_file() and not path.is_symlink():  # a deleted tracked file is gone
            entries.append((name, _blob_id(path.read_bytes())))
    return _digest(entries)


def code_digest_at(revision: str, repo: Path | None = None) -> str | None:
    """The product code's digest at a committed revision (None: not in this repository)."""
    where = repo or SOURCE_ROOT
    try:
        out = _git(["ls-tree", "-r", "-z", revision, "--", *CODE_PATHS], where).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    entries = []
    for item in filter(None, out.split("\0")):
        meta, _, name = item.partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000":  # files, as code_digest counts them
            entries.append((name, blob))
    return _digest(entries)


def file_at(revision: str, name: str, repo: Path | None = None) -> bytes | None:
    """A file's bytes at a committed revision (None: no such file or revision)."""
    try:
        return bytes(_git(["show", f"{revision}:{name}"], repo or SOURCE_ROOT,
                          text=False).stdout)
    except (OSError, subprocess.SubprocessError):
        return None


def is_ancestor(revision: str, of: str = "HEAD", repo: Path | None = None) -> bool | None:
    """Whether ``revision`` is reachable from ``of`` (None: not a git checkout, or
    ``of`` does not exist)."""
    where = repo or SOURCE_ROOT
    try:
        _git(["rev-parse", "--verify", "--quiet", f"{of}^{{commit}}"], where)
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return subprocess.run(["git", "merge-base", "--is-ancestor", revision, of], cwd=where,
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None


def main_branch(repo: Path | None = None) -> str | None:
    """The repository's main line: ``main``, else ``master`` (None: neither exists)."""
    where = repo or SOURCE_ROOT
    for name in ("main", "master"):
        try:
            _git(["rev-parse", "--verify", "--quiet", f"refs/heads/{name}"], where)
        except (OSError, subprocess.SubprocessError):
            continue
        return name
    return None


def code_provenance(repo: Path | None = None) -> dict[str, Any]:
    """What a session records of the code it runs: revision, dirty flags, code digest."""
    return {**git_revision(repo), "code_sha256": code_digest(repo)}
