"""Files that are either absent, old, or whole: write to a temporary name, fsync, rename.

A temporary name never looks like a final one (``.<name>.tmp-<pid>``), so a killed
writer never leaves a torn file that is read as a result. A full disk (or quota) is
therefore no damage either: the write fails whole, and :class:`ResultsDiskFull` says in
one line which file could not be written (``--resume`` continues once there is space).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from testbed.errors import HostError

TMP_MARK = ".tmp-"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class ResultsDiskFull(HostError):
    """No space left where the results go; one line naming the file."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(f"results disk full: no space left writing {path}; free space "
                         "there, then run the same command with --resume (nothing written "
                         "so far is lost)")
        self.path = Path(path)


@contextlib.contextmanager
def space_for(path: Path | str) -> Iterator[None]:
    """Writing PATH (a file, or a SQLite database): a full disk is ResultsDiskFull."""
    try:
        yield
    except OSError as exc:  # pyarrow's write errors are OSErrors with the errno too
        if exc.errno not in NO_SPACE:
            raise
        raise ResultsDiskFull(path) from None
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
            raise
        raise ResultsDiskFull(path) from None


def disk_full_in(exc: BaseException, where: Path | str) -> ResultsDiskFull | None:
    """The full-disk error EXC is or holds (through exception groups, where a run's
    tasks put it), unless it holds an interrupt too; a bare ENOSPC names its file, else
    WHERE."""
    if isinstance(exc, BaseExceptionGroup):
        if exc.subgroup(KeyboardInterrupt) is not None:
            return None
        for inner in exc.exceptions:
            if (found := disk_full_in(inner, where)) is not None:
                return found
        return None
    if isinstance(exc, ResultsDiskFull):
        return exc
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return ResultsDiskFull(exc.filename or where)
    return None


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: Path, final: Path) -> None:
    """fsync ``tmp`` and rename it over ``final`` (atomic on POSIX), then fsync the dir."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def write_table_atomic(table: pa.Table, final: Path) -> None:
    """Write a Parquet file so that ``final`` is either absent, old, or whole."""
    tmp = _tmp_name(final)
    try:
        with space_for(final):
            pq.write_table(table, tmp)
            _commit(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json_atomic(data: Mapping[str, Any], final: Path) -> None:
    tmp = _tmp_name(final)
    try:
        with space_for(final):
            tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
            _commit(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
