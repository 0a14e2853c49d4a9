"""The run directory: manifest, episode ledger, per-episode Parquet shards, consolidation.

Rules this module obeys (a killed campaign loses at most the episode in flight):

1. Layout of ``<out>/``: ``manifest.json``, ``state.sqlite`` (episode ledger),
   ``shards/actions/<episode>.parquet``, ``shards/episodes/<episode>.parquet`` and,
   after :meth:`RunDir.consolidate`, ``actions.parquet`` and ``episodes.parquet``.
2. An episode is marked ``started`` in the ledger before it runs. Its results are
   written as two shards, each to a temporary name, fsynced, then ``os.replace``d to
   its final name: the actions shard first, the episode shard last. The rename of the
   episode shard is the commit point: an episode is complete exactly when its episode
   shard exists under its final name, and the ledger's ``complete`` mark is set right
   after (a kill between the two is reconciled on the next open).
3. A temporary file never has a final name, so a kill never leaves a torn file that
   is read as a result; leftovers are deleted when the directory is opened.
4. Consolidation reads only committed shards, deduplicates by episode key and writes
   both tables under temporary names before renaming them. Raw shards are never
   rewritten by analysis.
5. The consolidated tables are the portable form of a run (results/ commits them and
   ignores shards/ and state.sqlite). Opening a directory whose consolidated tables
   hold episodes that have no shard (a fresh clone) first writes those shards back
   from the tables, so ``--resume`` and ``--extend`` never repeat a committed episode.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# --- result columns (DESIGN.md "Result columns", plus the documented extras) ----------

#: Columns that identify a cell (the configuration an episode ran under).
CELL_COLUMNS: tuple[str, ...] = (
    "campaign", "cell", "policy", "network", "backend", "trace_offset_s", "connection",
    "agents", "keys", "deps", "rho", "tier", "units",
)
#: Columns identifying the episode and its schedule.
EPISODE_ID_COLUMNS: tuple[str, ...] = ("episode", "family", "template", "schedule_digest")

#: Per protected action, written by the runner (every one required).
RUNNER_ACTION_FIELDS: tuple[str, ...] = (
    "action", "outcome", "invalid", "complete", "replans", "stall_ms", "bytes", "connections",
    "block_reason",
)
#: Per episode, written by the runner (every one required for a completed episode).
RUNNER_EPISODE_FIELDS: tuple[str, ...] = (
    "stall_ms_per_action", "stall_action_ms", "stall_barrier_ms", "stall_commit_ms",
    "kib_per_action", "connections", "link_bytes", "wall_s", "congestion_control",
)

_CELL_TYPES: dict[str, pa.DataType] = {
    "campaign": pa.string(), "cell": pa.string(), "policy": pa.string(),
    "network": pa.string(), "backend": pa.string(), "trace_offset_s": pa.float64(),
    "connection": pa.string(), "agents": pa.int64(), "keys": pa.int64(), "deps": pa.int64(),
    "rho": pa.float64(), "tier": pa.string(), "units": pa.int64(),
    "episode": pa.string(), "family": pa.string(), "template": pa.string(),
    "schedule_digest": pa.string(),
}
_ACTION_TYPES: dict[str, pa.DataType] = {
    "unit": pa.int64(), "planner": pa.string(), "executor": pa.string(),
    "action": pa.string(), "outcome": pa.string(), "invalid": pa.bool_(),
    "complete": pa.bool_(), "replans": pa.int64(), "stall_ms": pa.float64(),
    "bytes": pa.int64(), "connections": pa.int64(), "block_reason": pa.string(),
}
_EPISODE_TYPES: dict[str, pa.DataType] = {
    "seed": pa.int64(), "scheduled_actions": pa.int64(), "attempted_actions": pa.int64(),
    "updates": pa.int64(), "aborted": pa.bool_(), "abort_reason": pa.string(),
    "stall_ms_per_action": pa.float64(), "stall_action_ms": pa.float64(),
    "stall_barrier_ms": pa.float64(), "stall_commit_ms": pa.float64(),
    "kib_per_action": pa.float64(), "connections": pa.int64(), "link_bytes": pa.int64(),
    "wall_s": pa.float64(), "congestion_control": pa.string(),
}
ACTION_SCHEMA = pa.schema([*(pa.field(c, _CELL_TYPES[c]) for c in _CELL_TYPES),
                           *(pa.field(c, t) for c, t in _ACTION_TYPES.items())])
EPISODE_SCHEMA = pa.schema([*(pa.field(c, _CELL_TYPES[c]) for c in _CELL_TYPES),
                            *(pa.field(c, t) for c, t in _EPISODE_TYPES.items())])
ACTION_COLUMNS: tuple[str, ...] = tuple(ACTION_SCHEMA.names)
EPISODE_COLUMNS: tuple[str, ...] = tuple(EPISODE_SCHEMA.names)

_PACKAGES = ("planfence-testbed", "trio", "pyroute2", "msgpack", "PyNaCl", "numpy", "pandas",
             "pyarrow", "rich", "pydantic")
_TMP_MARK = ".tmp-"


class RunDirError(ValueError):
    """The run directory cannot be used as asked (the caller's choice of directory)."""


class ResultRowError(ValueError):
    """The runner handed back rows that break the result-column contract (runner bug)."""


# --- atomic files ---------------------------------------------------------------------


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}{_TMP_MARK}{os.getpid()}")


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


def _table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, what: str) -> pa.Table:
    try:
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise ResultRowError(f"{what}: a value does not fit the column types: {exc}") from exc


def check_fields(row: Mapping[str, Any], required: Iterable[str], allowed: Iterable[str],
                 what: str) -> None:
    """Every ``required`` field present and nothing outside ``allowed`` (one-line error)."""
    missing = [f for f in required if f not in row]
    if missing:
        raise ResultRowError(f"{what}: missing field(s) {', '.join(missing)}")
    extra = sorted(set(row) - set(allowed))
    if extra:
        raise ResultRowError(f"{what}: unknown field(s) {', '.join(extra)}; "
                             f"allowed: {', '.join(allowed)}")


# --- provenance -----------------------------------------------------------------------


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
    where = repo or Path(__file__).resolve().parents[1]
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
            "implementation": platform.python_implementation(), "cpus": os.cpu_count()}


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- the run directory ----------------------------------------------------------------


class RunDir:
    """One campaign's results directory (see the module rules)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.actions_dir = self.path / "shards" / "actions"
        self.episodes_dir = self.path / "shards" / "episodes"
        self.manifest_path = self.path / "manifest.json"
        self.lock_path = self.path / ".run.lock"
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None

    # -- lifecycle
    def is_empty(self) -> bool:
        return not self.path.exists() or all(p == self.lock_path for p in self.path.iterdir())

    def open(self) -> None:
        """Lock the directory, create the layout, delete leftover temporaries, open and
        reconcile the ledger."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        self.actions_dir.mkdir(parents=True, exist_ok=True)
        self.episodes_dir.mkdir(parents=True, exist_ok=True)
        for folder in (self.path, self.actions_dir, self.episodes_dir):
            for leftover in folder.glob(f".*{_TMP_MARK}*"):
                leftover.unlink()
        db = sqlite3.connect(self.path / "state.sqlite", isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS episodes (key TEXT PRIMARY KEY, "
                   "status TEXT NOT NULL CHECK (status IN ('started', 'complete')), "
                   "attempts INTEGER NOT NULL, started_at TEXT, completed_at TEXT, "
                   "aborted INTEGER)")
        self._db = db
        self._restore_shards()
        for key in self.completed():
            db.execute("UPDATE episodes SET status='complete' WHERE key=? AND "
                       "status='started'", (key,))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock(self) -> None:
        """One `testbed run` per directory at a time: two would run the same episodes and
        overwrite each other's shards. The kernel drops the flock if the holder dies."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"{self.path}: in use by another `testbed run` (pid {holder}); "
                              "wait for it or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("RunDir.open() first")
        return self._db

    # -- manifest
    def read_manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {}
        data = json.loads(self.manifest_path.read_text())
        if not isinstance(data, dict):
            raise RunDirError(f"{self.manifest_path}: expected a JSON object")
        return data

    def update_manifest(self, **fields: Any) -> dict[str, Any]:
        manifest = self.read_manifest()
        manifest.update(fields)
        write_json_atomic(manifest, self.manifest_path)
        return manifest

    # -- ledger
    def _shard_name(self, key: str) -> str:
        return key.replace("/", "~") + ".parquet"

    def mark_started(self, key: str) -> None:
        self.db.execute(
            "INSERT INTO episodes (key, status, attempts, started_at) VALUES (?, 'started', 1, ?) "
            "ON CONFLICT(key) DO UPDATE SET status='started', attempts=attempts+1, "
            "started_at=excluded.started_at, completed_at=NULL",
            (key, _now_iso()))

    def record_episode(self, key: str, actions: Sequence[Mapping[str, Any]],
                       episode: Mapping[str, Any]) -> None:
        """Commit an episode's rows (full result-column rows) as shards, then mark it."""
        if episode.get("episode") != key or any(a.get("episode") != key for a in actions):
            raise ResultRowError(f"episode {key}: rows carry a different episode key")
        action_table = _table(actions, ACTION_SCHEMA, f"episode {key}: action rows")
        episode_table = _table([episode], EPISODE_SCHEMA, f"episode {key}: episode row")
        name = self._shard_name(key)
        write_table_atomic(action_table, self.actions_dir / name)
        write_table_atomic(episode_table, self.episodes_dir / name)  # the commit point
        self.db.execute("UPDATE episodes SET status='complete', completed_at=?, aborted=? "
                        "WHERE key=?", (_now_iso(), int(bool(episode.get("aborted"))), key))

    def completed(self) -> set[str]:
        """Keys of committed episodes (their episode shard exists under its final name)."""
        if not self.episodes_dir.exists():
            return set()
        keys = set()
        for shard in self.episodes_dir.glob("*.parquet"):
            keys.add(shard.name.removesuffix(".parquet").replace("~", "/"))
        return keys

    def ledger(self) -> dict[str, tuple[str, int]]:
        """key -> (status, attempts) as recorded in ``state.sqlite``."""
        rows = self.db.execute("SELECT key, status, attempts FROM episodes").fetchall()
        return {str(k): (str(s), int(n)) for k, s, n in rows}

    def _restore_shards(self) -> int:
        """Write shards for episodes that only the consolidated tables hold (rule 5)."""
        episodes_path = self.path / "episodes.parquet"
        if not episodes_path.exists():
            return 0
        episodes = pq.read_table(episodes_path, schema=EPISODE_SCHEMA)
        done = self.completed()
        missing = sorted(set(episodes.column("episode").to_pylist()) - done)
        if not missing:
            return 0
        actions_path = self.path / "actions.parquet"
        actions = (pq.read_table(actions_path, schema=ACTION_SCHEMA) if actions_path.exists()
                   else ACTION_SCHEMA.empty_table())
        episode_keys = episodes.column("episode")
        action_keys = actions.column("episode")
        for key in missing:
            name = self._shard_name(key)
            write_table_atomic(actions.filter(pc.equal(action_keys, key)),
                               self.actions_dir / name)
            write_table_atomic(episodes.filter(pc.equal(episode_keys, key)),
                               self.episodes_dir / name)
            self.db.execute(
                "INSERT INTO episodes (key, status, attempts, completed_at, aborted) "
                "VALUES (?, 'complete', 1, ?, NULL) ON CONFLICT(key) DO NOTHING",
                (key, _now_iso()))
        return len(missing)

    # -- consolidation
    def consolidate(self) -> tuple[int, int]:
        """Write actions.parquet and episodes.parquet from committed shards (atomically).

        Returns (action rows, episode rows).
        """
        keys = sorted(self.completed())
        episode_tables = [pq.read_table(self.episodes_dir / self._shard_name(k),
                                        schema=EPISODE_SCHEMA) for k in keys]
        action_tables = []
        for k in keys:
            shard = self.actions_dir / self._shard_name(k)
            if shard.exists():
                action_tables.append(pq.read_table(shard, schema=ACTION_SCHEMA))
        episodes = _dedupe(pa.concat_tables(episode_tables) if episode_tables
                           else EPISODE_SCHEMA.empty_table())
        actions = _dedupe(pa.concat_tables(action_tables) if action_tables
                          else ACTION_SCHEMA.empty_table(), by=("episode", "action"))
        write_table_atomic(actions, self.path / "actions.parquet")
        write_table_atomic(episodes, self.path / "episodes.parquet")
        return actions.num_rows, episodes.num_rows


def _dedupe(table: pa.Table, by: tuple[str, ...] = ("episode",)) -> pa.Table:
    """Keep the last row per ``by`` (shards are one per episode, so this is a guard)."""
    seen: dict[tuple[Any, ...], int] = {}
    columns = [table.column(c).to_pylist() for c in by]
    for index, ident in enumerate(zip(*columns, strict=True)):
        seen[ident] = index
    keep = sorted(seen.values())
    if len(keep) == table.num_rows:
        return table
    return table.take(pa.array(keep, type=pa.int64()))
