"""Reading a node's store back from its files, and where the store lives.

Rules of this module:

1. A store opened with ``locking_mode=EXCLUSIVE`` keeps its pages in the process's cache
   and never re-reads them, so a database or WAL file overwritten under the node would
   be served from memory unnoticed. :func:`read_back` reads the files' headers from
   disk: the database's (``SQLite format 3``, its page size) and, when the WAL holds
   frames, the WAL's (magic number, the same page size). Anything else means the file
   is no longer the store this node wrote: the caller fails loudly.
2. :class:`StoreFiles` keeps the two files open, so a read-back after an install costs
   two ``pread`` calls (a few microseconds); the periodic one (``nodes.node``: every
   ``CHECK_INTERVAL_S``, ``replaced=True``) also checks that the paths still name the
   files it holds open (a store replaced by another file, or deleted, is not its own).
3. :func:`describe_location` says where a store lives: its directory, the file system
   type and mount point (``/proc/self/mounts``, the longest mount point containing it),
   so a manifest can tell a tmpfs (an fsync is free) from a disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHECK_INTERVAL_S = 0.5
_DB_MAGIC = b"SQLite format 3\x00"
_WAL_MAGICS = (0x377F0682, 0x377F0683)
_WAL_HEADER_BYTES = 32


def _pread(path: Path, size: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


class StoreFiles:
    """A store's database and WAL, held open for cheap read-backs (rule 2)."""

    def __init__(self, path: Path, *, expected_page_size: int) -> None:
        self.path = Path(path)
        self.expected_page_size = expected_page_size
        self._fds: dict[str, int] = {}

    def _fd(self, suffix: str) -> int | None:
        fd = self._fds.get(suffix)
        if fd is None:
            try:
                fd = os.open(f"{self.path}{suffix}", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            self._fds[suffix] = fd
        return fd

    def check(self, *, replaced: bool = False) -> str | None:
        """Why the files are no longer the ones the store wrote, or None (rule 1);
        ``replaced``: also whether the paths still name the files held open."""
        if replaced:
            for suffix, fd in self._fds.items():
                name = f"{self.path}{suffix}"
                try:
                    now = os.stat(name)
                except FileNotFoundError:
                    return f"{name} is gone"
                held = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                    return f"{name} was replaced by another file"
        db = self._fd("")
        if db is None:
            return f"database file {self.path} is gone"
        wal = self._fd("-wal")
        return check_headers(self.path, os.pread(db, 100, 0),
                             None if wal is None else os.pread(wal, _WAL_HEADER_BYTES, 0),
                             expected_page_size=self.expected_page_size)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def page_size(header: bytes) -> int:
    """The page size a database header declares (1 means 65536)."""
    value = int.from_bytes(header[16:18], "big")
    return 65536 if value == 1 else value


def read_back(path: Path, *, expected_page_size: int) -> str | None:
    """Why the store's files at ``path`` are not the ones this node wrote, or None
    (opens them for this one check)."""
    header = _pread(path, 100)
    if header is None:
        return f"database file {path} is gone"
    return check_headers(path, header, _pread(Path(f"{path}-wal"), _WAL_HEADER_BYTES),
                         expected_page_size=expected_page_size)


def check_headers(path: Path, header: bytes, head: bytes | None, *,
                  expected_page_size: int) -> str | None:
    """Rule 1 on the first bytes of the database (``header``) and of its WAL (``head``,
    None when there is no WAL file)."""
    if len(header) < 100 or not header.startswith(_DB_MAGIC):
        return f"database file {path} no longer starts with the SQLite header"
    if page_size(header) != expected_page_size:
        return (f"database file {path} declares page size {page_size(header)}, "
                f"not {expected_page_size}")
    wal = f"{path}-wal"
    if head is None or len(head) == 0:
        return None  # no WAL yet, or reset by a checkpoint
    if len(head) < _WAL_HEADER_BYTES:
        return f"WAL file {wal} has a truncated header ({len(head)} bytes)"
    if int.from_bytes(head[0:4], "big") not in _WAL_MAGICS:
        return f"WAL file {wal} no longer starts with the WAL magic number"
    if int.from_bytes(head[8:12], "big") != expected_page_size:
        return f"WAL file {wal} declares another page size than its database"
    return None


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def describe_location(directory: Path, mounts: str | None = None) -> dict[str, Any]:
    """Where stores in ``directory`` live (rule 3): ``{"dir", "fs_type", "mount"}``."""
    resolved = Path(os.path.realpath(directory))
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            mounts = ""
    best: tuple[int, str, str] = (-1, "unknown", "")
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point, fs_type = _unescape(parts[1]), parts[2]
        inside = resolved == Path(point) or Path(point) in resolved.parents
        if inside and len(point) >= best[0]:
            best = (len(point), fs_type, point)
    return {"dir": str(resolved), "fs_type": best[1], "mount": best[2]}
