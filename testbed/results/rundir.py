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
4. Consolidation reads only committed shards, deduplicates by (episode, attempt), writes
   both tables under temporary names before renaming them. Raw shards are never
   rewritten by analysis.
5. The consolidated tables are the portable form of a run (results/ commits them and
   ignores shards/ and state.sqlite). Opening a directory whose consolidated tables
   hold episodes that have no shard (a fresh clone) first writes those shards back
   from the tables, so ``--resume`` and ``--extend`` never repeat a committed episode.
6. Attempts: an episode may run several times with the same schedule (repeats, reruns
   of a disturbed run), each its own pair of shards (``<episode>.parquet`` for attempt
   1, ``<episode>@<n>.parquet`` for attempt n) and rows with that ``attempt`` number;
   none replaces another. The ledger's ``attempts`` table records each committed
   attempt's repeat, disturbed and aborted flags (reconciled from the shards on open),
   which is what the loop plans the next attempts from.
7. A run that ends before its first episode is committed, in a directory that held no
   run, leaves nothing (:meth:`RunDir.discard`): no manifest, ledger, lock or shard
   folders, and the folder itself if the run made it, so the next plain run starts
   there as if nothing had happened.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from testbed.errors import UserError
from testbed.results.aborts import retried_on_resume
from testbed.results.atomic import TMP_MARK, space_for, write_json_atomic, write_table_atomic
from testbed.results.schema import ACTION_SCHEMA, EPISODE_SCHEMA, ResultRowError, rows_table

ATTEMPT_MARK = "@"


class Attempt(NamedTuple):
    """One committed attempt of an episode (rule 6)."""

    attempt: int
    repeat: int
    disturbed: bool
    aborted: bool
    retry: bool = False  # aborted by the infrastructure: --resume runs it again (aborts.py)


def split_shard_name(stem: str) -> tuple[str, int]:
    """(episode key, attempt) of a shard's file stem (rule 6)."""
    base, mark, number = stem.rpartition(ATTEMPT_MARK)
    if mark and number.isdigit() and int(number) > 1:
        return base.replace("~", "/"), int(number)
    return stem.replace("~", "/"), 1


class RunDirError(UserError):
    """The run directory cannot be used as asked (the caller's choice of directory)."""


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")



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
        """Nothing of a campaign here: no directory, or only what a run killed before it
        wrote its manifest leaves (the lock, an empty layout, its episode ledger)."""
        if not self.path.exists() or all(p == self.lock_path for p in self.path.iterdir()):
            return True
        return not self.manifest_path.exists() and not any(
            folder.is_dir() and any(folder.iterdir())
            for folder in (self.actions_dir, self.episodes_dir)) and all(
            p.name in (self.lock_path.name, "shards", "state.sqlite", "state.sqlite-journal")
            for p in self.path.iterdir())

    def open(self) -> None:
        """Lock the directory, create the layout, delete leftover temporaries, open and
        reconcile the ledger."""
        with space_for(self.path):
            self._open()

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        self.actions_dir.mkdir(parents=True, exist_ok=True)
        self.episodes_dir.mkdir(parents=True, exist_ok=True)
        for folder in (self.path, self.actions_dir, self.episodes_dir):
            for leftover in folder.glob(f".*{TMP_MARK}*"):
                leftover.unlink()
        db = sqlite3.connect(self.db_path, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS episodes (key TEXT PRIMARY KEY, "
                   "status TEXT NOT NULL CHECK (status IN ('started', 'complete')), "
                   "attempts INTEGER NOT NULL, started_at TEXT, completed_at TEXT, "
                   "aborted INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT NOT NULL, "
                   "attempt INTEGER NOT NULL, repeat INTEGER NOT NULL, "
                   "disturbed INTEGER NOT NULL, aborted INTEGER NOT NULL, "
                   "retry INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, attempt))")
        columns = {str(row[1]) for row in db.execute("PRAGMA table_info(attempts)")}
        if "retry" not in columns:  # a run directory made before infrastructure aborts
            db.execute("ALTER TABLE attempts ADD COLUMN retry INTEGER NOT NULL DEFAULT 0")
        self._db = db
        self._restore_shards()
        for key in self.completed():
            db.execute("UPDATE episodes SET status='complete' WHERE key=? AND "
                       "status='started'", (key,))
        self._reconcile_attempts()

    def discard(self, *, remove_folder: bool) -> None:
        """Remove what :meth:`open` and the loop made in a directory that held no run
        (rule 7): only the layout's own names, never a committed shard; the folder too
        with REMOVE_FOLDER (this run created it) when nothing else is left in it."""
        if self.completed():
            raise RunDirError(f"{self.path}: holds committed episodes; not discarded")
        self.close()
        for name in ("manifest.json", "state.sqlite", "state.sqlite-journal",
                     "state.sqlite-wal", "state.sqlite-shm", self.lock_path.name):
            (self.path / name).unlink(missing_ok=True)
        for folder in (self.actions_dir, self.episodes_dir):
            if folder.is_dir():  # no episode is committed: these are uncommitted halves
                for leftover in folder.iterdir():
                    leftover.unlink()
                folder.rmdir()
        shards = self.path / "shards"
        if shards.is_dir() and not any(shards.iterdir()):
            shards.rmdir()
        links = self.path / "links"
        if links.is_dir():
            shutil.rmtree(links)
        if remove_folder and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()

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
    def _shard_name(self, key: str, attempt: int = 1) -> str:
        stem = key.replace("/", "~")
        return (stem if attempt <= 1 else f"{stem}{ATTEMPT_MARK}{attempt}") + ".parquet"

    @property
    def db_path(self) -> Path:
        return self.path / "state.sqlite"

    def mark_started(self, key: str) -> None:
        with space_for(self.db_path):
            self.db.execute(
                "INSERT INTO episodes (key, status, attempts, started_at) VALUES "
                "(?, 'started', 1, ?) ON CONFLICT(key) DO UPDATE SET status='started', "
                "attempts=attempts+1, started_at=excluded.started_at, completed_at=NULL",
                (key, _now_iso()))

    def record_episode(self, key: str, actions: Sequence[Mapping[str, Any]],
                       episode: Mapping[str, Any]) -> None:
        """Commit an episode's rows (full result-column rows) as shards, then mark it."""
        if episode.get("episode") != key or any(a.get("episode") != key for a in actions):
            raise ResultRowError(f"episode {key}: rows carry a different episode key")
        attempt = _attempt_of(episode)
        if any(_attempt_of(a) != attempt for a in actions):
            raise ResultRowError(f"episode {key}: action rows carry another attempt")
        action_table = rows_table(actions, ACTION_SCHEMA, f"episode {key}: action rows")
        episode_table = rows_table([episode], EPISODE_SCHEMA, f"episode {key}: episode row")
        name = self._shard_name(key, attempt)
        if (self.episodes_dir / name).exists():
            raise ResultRowError(f"episode {key}: attempt {attempt} is already committed")
        write_table_atomic(action_table, self.actions_dir / name)
        write_table_atomic(episode_table, self.episodes_dir / name)  # the commit point
        with space_for(self.db_path):  # the ledger follows the shards on the next open
            self.db.execute("UPDATE episodes SET status='complete', completed_at=?, "
                            "aborted=? WHERE key=?",
                            (_now_iso(), int(bool(episode.get("aborted"))), key))
            self._note_attempt(key, _attempt_record(episode))

    def completed(self) -> set[str]:
        """Keys of committed episodes (their episode shard exists under its final name)."""
        if not self.episodes_dir.exists():
            return set()
        return {key for key, _ in self._committed_attempts()}

    def _committed_attempts(self) -> set[tuple[str, int]]:
        if not self.episodes_dir.exists():
            return set()
        return {split_shard_name(shard.name.removesuffix(".parquet"))
                for shard in self.episodes_dir.glob("*.parquet")}

    def attempts(self) -> dict[str, list[Attempt]]:
        """key -> its committed attempts in attempt order (rule 6)."""
        out: dict[str, list[Attempt]] = {}
        rows = self.db.execute("SELECT key, attempt, repeat, disturbed, aborted, retry FROM "
                               "attempts ORDER BY key, attempt").fetchall()
        for key, attempt, repeat, disturbed, aborted, retry in rows:
            out.setdefault(str(key), []).append(
                Attempt(int(attempt), int(repeat), bool(disturbed), bool(aborted),
                        bool(retry)))
        return out

    def _note_attempt(self, key: str, record: Attempt) -> None:
        self.db.execute("INSERT OR REPLACE INTO attempts (key, attempt, repeat, disturbed, "
                        "aborted, retry) VALUES (?, ?, ?, ?, ?, ?)",
                        (key, record.attempt, record.repeat, int(record.disturbed),
                         int(record.aborted), int(record.retry)))

    def _reconcile_attempts(self) -> None:
        """Record committed attempts the ledger does not know (a kill between the
        shard's rename and the ledger update; shards restored from a clone)."""
        known = {(str(k), int(a)) for k, a in
                 self.db.execute("SELECT key, attempt FROM attempts").fetchall()}
        for key, attempt in sorted(self._committed_attempts() - known):
            shard = self.episodes_dir / self._shard_name(key, attempt)
            rows = pq.read_table(shard, schema=EPISODE_SCHEMA).to_pylist()
            if rows:
                self._note_attempt(key, _attempt_record(rows[0])._replace(attempt=attempt))

    def ledger(self) -> dict[str, tuple[str, int]]:
        """key -> (status, attempts) as recorded in ``state.sqlite``."""
        rows = self.db.execute("SELECT key, status, attempts FROM episodes").fetchall()
        return {str(k): (str(s), int(n)) for k, s, n in rows}

    def _restore_shards(self) -> int:
        """Write shards for episodes that only the consolidated tables hold (rule 5)."""
        episodes_path = self.path / "episodes.parquet"
        if not episodes_path.exists():
            return 0
        episodes = _with_attempts(pq.read_table(episodes_path, schema=EPISODE_SCHEMA))
        done = self._committed_attempts()
        held = set(zip(episodes.column("episode").to_pylist(),
                       episodes.column("attempt").to_pylist(), strict=True))
        missing = sorted(held - done)
        if not missing:
            return 0
        actions_path = self.path / "actions.parquet"
        actions = _with_attempts(pq.read_table(actions_path, schema=ACTION_SCHEMA)
                                 if actions_path.exists() else ACTION_SCHEMA.empty_table())

        def rows_of(table: pa.Table, key: str, attempt: int) -> pa.Table:
            mask = pc.and_(pc.equal(table.column("episode"), key),
                           pc.equal(table.column("attempt"), attempt))
            return table.filter(mask)

        for key, attempt in missing:
            name = self._shard_name(key, attempt)
            write_table_atomic(rows_of(actions, key, attempt), self.actions_dir / name)
            write_table_atomic(rows_of(episodes, key, attempt), self.episodes_dir / name)
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
        keys = sorted(self._committed_attempts())
        episode_tables = [_with_attempts(pq.read_table(
            self.episodes_dir / self._shard_name(k, a), schema=EPISODE_SCHEMA), a)
            for k, a in keys]
        action_tables = []
        for k, a in keys:
            shard = self.actions_dir / self._shard_name(k, a)
            if shard.exists():
                action_tables.append(_with_attempts(pq.read_table(shard, schema=ACTION_SCHEMA),
                                                    a))
        episodes = _dedupe(pa.concat_tables(episode_tables) if episode_tables
                           else EPISODE_SCHEMA.empty_table(), by=("episode", "attempt"))
        actions = _dedupe(pa.concat_tables(action_tables) if action_tables
                          else ACTION_SCHEMA.empty_table(), by=("episode", "attempt", "action"))
        write_table_atomic(actions, self.path / "actions.parquet")
        write_table_atomic(episodes, self.path / "episodes.parquet")
        return actions.num_rows, episodes.num_rows


def _attempt_of(row: Mapping[str, Any]) -> int:
    value = row.get("attempt")
    return 1 if value is None else int(value)


def _attempt_record(row: Mapping[str, Any]) -> Attempt:
    repeat = row.get("repeat")
    aborted = bool(row.get("aborted"))
    return Attempt(_attempt_of(row), 1 if repeat is None else int(repeat),
                   bool(row.get("disturbed")), aborted,
                   aborted and retried_on_resume(row.get("abort_reason")))


def _with_attempts(table: pa.Table, attempt: int | None = None) -> pa.Table:
    """The table with its null ``attempt`` values (rows written before attempts existed,
    always attempt 1) filled: with ``attempt`` when the shard's name says it, else 1."""
    index = table.schema.get_field_index("attempt")
    column = table.column(index)
    if column.null_count == 0:
        return table
    filled = pc.fill_null(column, pa.scalar(attempt or 1, type=pa.int64()))
    return table.set_column(index, "attempt", filled)


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
