"""Files that are either absent, old, or whole: write to a temporary name, fsync, rename.

A temporary name never looks like a final one (``.<name>.tmp-<pid>``), so a killed
writer never leaves a torn file that is read as a result.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TMP_MARK = ".tmp-"


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
        pq.write_table(table, tmp)
        _commit(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json_atomic(data: Mapping[str, Any], final: Path) -> None:
    tmp = _tmp_name(final)
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        _commit(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
