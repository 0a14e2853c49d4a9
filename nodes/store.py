"""The node's durable record store: one SQLite file per node (WAL).

Rules this module enforces (the owner rules of docs/architecture.md):

1. Every record is verified before anything is written (digest, author signature,
   author = declared owner). A rejected record leaves no trace: each install runs in
   one transaction that is rolled back on any error.
2. Two different records with the same (key, owner, seq) are a conflict, wherever
   they are installed (:class:`ConflictError`).
3. For keys this node owns (per the roster) the head advances only to a record with a
   strictly higher sequence; an older version is stored (superseded versions stay
   readable) but does not move the head. Every head change is appended to
   ``head_log`` with a CLOCK_MONOTONIC timestamp.
4. Synced heads (learned from announcements) follow ``protocols.heads`` rule 2: never
   lowered behind a head whose record this store holds; an unproven claim is replaced
   by the owner's next announcement, so a bogus one cannot wedge the key.
5. The central directory (``dir_heads``) advances only when the declared owner of a
   key commits its next version in order (``protocols.heads`` rule 3: the seed, then
   the head plus one); the same (seq, id) again is a no-op.
6. A policy's state (``policy_state``, :class:`PolicyStateArea`) is a key-value area per
   policy name; each write is one commit at the store's durability setting, and it
   goes with the store file, so it is reset with the episode.
7. A second record at a (key, owner, seq) already held is equivocation by that owner
   (:class:`protocols.heads.EquivocationError`; both records verified, so both carry
   its signature).
8. The store is read back from disk after every install (:meth:`SqliteStore.read_back`,
   ``nodes.store_check``; a mismatch raises :class:`StoreReadBackError`, the node's
   ``store_failed``), and the node reads it back while it runs and at each episode's
   end: a file overwritten under it ends the node with the reason.

Durability ``full`` = ``synchronous=FULL`` (fsync at every commit), ``normal`` =
``synchronous=NORMAL`` (fsync at WAL checkpoints only).

A store is opened by its node alone, so the connection holds the database lock for its
lifetime (``locking_mode=EXCLUSIVE``, set before WAL: the WAL index lives in the
process's memory, no ``-shm`` file). Reads then take no file lock per statement (two
``fcntl`` calls less per head query); commits and their fsyncs are unchanged.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from nodes.store_check import StoreFiles
from protocols.errors import ConflictError, LocalProtocolError, OwnerRuleError
from protocols.heads import adopt_announced, check_commit, equivocation
from protocols.identity import Roster
from protocols.policy_rpc import MAX_STATE_VALUE_BYTES, check_state_key
from protocols.records import RECORD_ID_BYTES, HeadInfo, Record, verify_record

DURABILITY_MODES = {"full": "FULL", "normal": "NORMAL"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id BLOB PRIMARY KEY, key TEXT NOT NULL, owner TEXT NOT NULL, seq INTEGER NOT NULL,
    parents BLOB NOT NULL, rtype TEXT NOT NULL, content BLOB NOT NULL,
    author TEXT NOT NULL, sig BLOB NOT NULL, installed_ns INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS records_version ON records (key, owner, seq);
CREATE TABLE IF NOT EXISTS heads (key TEXT PRIMARY KEY, id BLOB NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS synced (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, seq INTEGER NOT NULL, id BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dir_heads (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, seq INTEGER NOT NULL, id BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_state (
    policy TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (policy, key)
);
CREATE TABLE IF NOT EXISTS head_log (
    n INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, seq INTEGER NOT NULL,
    id BLOB NOT NULL, t_ns INTEGER NOT NULL
);
"""


_CACHED_CONTENT_BYTES = 64 * 1024


def _pack_parents(parents: Sequence[bytes]) -> bytes:
    return b"".join(parents)


def _unpack_parents(blob: bytes) -> tuple[bytes, ...]:
    return tuple(blob[i:i + RECORD_ID_BYTES] for i in range(0, len(blob), RECORD_ID_BYTES))


def remove_store_files(path: Path) -> None:
    """Delete a store's database and its WAL/shared-memory side files."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class StoreReadBackError(sqlite3.DatabaseError):
    """The store's files on disk are no longer the ones it wrote (rule 8)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"store read back failed: {reason}")
        self.reason = reason


class SqliteStore:
    """:class:`protocols.env.LocalStore` over one SQLite database."""

    def __init__(self, path: Path, *, agent_id: str, roster: Roster,
                 durability: str = "full") -> None:
        if durability not in DURABILITY_MODES:
            raise LocalProtocolError(
                f"durability: {durability!r} not one of {', '.join(DURABILITY_MODES)}")
        self.path = Path(path)
        self.agent_id = agent_id
        self.roster = roster
        self.durability = durability
        self._db = sqlite3.connect(str(self.path), isolation_level=None,
                                   check_same_thread=False)
        # The empty schema needs no fsync (a lost one is just a fresh store), and
        # skipping them makes a per-episode store ~1 ms instead of ~50 ms here.
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
        self._db.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={DURABILITY_MODES[durability]}")
        self.page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        self._files = StoreFiles(self.path, expected_page_size=self.page_size)
        # Records are immutable and named by their digest, so a record read once can be
        # served from memory afterwards (the frontier re-reads the same ancestry on
        # every pass). Only committed records enter; large artifacts stay on disk.
        self._records: dict[bytes, Record] = {}

    # --- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        self._db.close()
        self._files.close()

    def read_back(self, *, replaced: bool = False) -> str | None:
        """Why this store's files on disk are no longer the ones it wrote, or None
        (``nodes.store_check``: the pages it serves come from its own cache);
        ``replaced``: also whether its paths still name the files it wrote."""
        return self._files.check(replaced=replaced)

    def pragma(self, name: str) -> object:
        """Read a PRAGMA (tests check the durability setting through this)."""
        if not name.isidentifier():
            raise LocalProtocolError(f"pragma: bad name {name!r}")
        row = self._db.execute(f"PRAGMA {name}").fetchone()
        return None if row is None else row[0]

    # --- reads -----------------------------------------------------------------------
    def get(self, record_id: bytes) -> Record | None:
        cached = self._records.get(record_id)
        if cached is not None:
            return cached
        row = self._db.execute(
            "SELECT key, owner, seq, parents, rtype, content, author, sig FROM records "
            "WHERE id = ?", (record_id,)).fetchone()
        if row is None:
            return None
        key, owner, seq, parents, rtype, content, author, sig = row
        record = Record(key, owner, seq, _unpack_parents(parents), rtype, content, author, sig)
        self._remember(record)
        return record

    def _remember(self, record: Record) -> None:
        if len(record.content) <= _CACHED_CONTENT_BYTES:
            self._records[record.id] = record

    def has(self, record_id: bytes) -> bool:
        return self._db.execute("SELECT 1 FROM records WHERE id = ?",
                                (record_id,)).fetchone() is not None

    def parents(self, record_id: bytes) -> tuple[bytes, ...] | None:
        row = self._db.execute("SELECT parents FROM records WHERE id = ?",
                               (record_id,)).fetchone()
        return None if row is None else _unpack_parents(row[0])

    def latest(self, key: str) -> HeadInfo | None:
        row = self._db.execute(
            "SELECT owner, seq, id FROM records WHERE key = ? ORDER BY seq DESC LIMIT 1",
            (key,)).fetchone()
        return None if row is None else HeadInfo(key, row[0], row[1], row[2])

    def head(self, key: str) -> HeadInfo | None:
        row = self._db.execute("SELECT id, seq FROM heads WHERE key = ?", (key,)).fetchone()
        return None if row is None else HeadInfo(key, self.agent_id, row[1], row[0])

    def synced_head(self, key: str) -> HeadInfo | None:
        row = self._db.execute("SELECT owner, seq, id FROM synced WHERE key = ?",
                               (key,)).fetchone()
        return None if row is None else HeadInfo(key, row[0], row[1], row[2])

    def dir_head(self, key: str) -> HeadInfo | None:
        row = self._db.execute("SELECT owner, seq, id FROM dir_heads WHERE key = ?",
                               (key,)).fetchone()
        return None if row is None else HeadInfo(key, row[0], row[1], row[2])

    def head_log(self) -> list[tuple[str, int, bytes, int]]:
        rows = self._db.execute("SELECT key, seq, id, t_ns FROM head_log ORDER BY n")
        return [(k, s, i, t) for k, s, i, t in rows]

    def install_log(self) -> list[tuple[bytes, str, str, int, tuple[bytes, ...], str, str, int]]:
        """Every stored record as (id, key, owner, seq, parents, rtype, author,
        installed_ns), in install order: what this node held, and since when."""
        rows = self._db.execute("SELECT id, key, owner, seq, parents, rtype, author, "
                                "installed_ns FROM records ORDER BY installed_ns, rowid")
        return [(i, k, o, s, _unpack_parents(p), r, a, t) for i, k, o, s, p, r, a, t in rows]

    def record_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM records").fetchone()[0])

    # --- writes ----------------------------------------------------------------------
    def install(self, record: Record) -> bool:
        """Verify and store ``record`` in one transaction; True if newly stored."""
        return self.install_many([record]) == 1

    def install_many(self, records: Iterable[Record]) -> int:
        """Verify and store records atomically (all or none); returns how many were new."""
        batch = list(records)
        for record in batch:
            verify_record(record, self.roster)
        new = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for record in batch:
                new += self._install_one(record)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite already rolled back after e.g. SQLITE_FULL
                self._db.execute("ROLLBACK")
            raise
        for record in batch:
            self._remember(record)
        failed = self.read_back()  # rule 8: what was just committed is still ours
        if failed is not None:
            raise StoreReadBackError(failed)
        return new

    def _install_one(self, record: Record) -> int:
        rid = record.id
        clash = self._db.execute(
            "SELECT id FROM records WHERE key = ? AND owner = ? AND seq = ?",
            (record.key, record.owner, record.seq)).fetchone()
        if clash is not None:
            if clash[0] != rid:
                held = self.get(clash[0])
                found = None if held is None else equivocation(held, record)
                if found is not None:
                    raise found
                raise ConflictError(f"{record.key!r} seq {record.seq} already held with "
                                    f"a different record")
            return 0
        self._db.execute(
            "INSERT INTO records (id, key, owner, seq, parents, rtype, content, author, sig,"
            " installed_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rid, record.key, record.owner, record.seq, _pack_parents(record.parents),
             record.rtype, record.content, record.author, record.signature,
             time.monotonic_ns()))
        if self.roster.owners.get(record.key) == self.agent_id:
            current = self.head(record.key)
            if current is None or record.seq > current.seq:
                self._db.execute("INSERT OR REPLACE INTO heads (key, id, seq) VALUES (?, ?, ?)",
                                 (record.key, rid, record.seq))
                self._db.execute("INSERT INTO head_log (key, seq, id, t_ns) VALUES (?, ?, ?, ?)",
                                 (record.key, record.seq, rid, time.monotonic_ns()))
        return 1

    def set_synced_head(self, head: HeadInfo) -> None:
        """Adopt an announced head (``protocols.heads`` rule 2)."""
        self._check_declared_owner(head)
        current = self.synced_head(head.key)
        proven = current is not None and self.has(current.record_id)
        if adopt_announced(current, head, proven=proven):
            self._db.execute("INSERT OR REPLACE INTO synced (key, owner, seq, id) "
                             "VALUES (?, ?, ?, ?)",
                             (head.key, head.owner, head.seq, head.record_id))

    def dir_commit(self, head: HeadInfo, *, committer: str) -> bool:
        """Advance the central directory's head; True if it moved.

        Raises OwnerRuleError if the committer is not the key's declared owner or the
        commit is out of order (``protocols.heads`` rule 3), EquivocationError for a
        different ID at the same seq.
        """
        self._check_declared_owner(head)
        if committer != head.owner:
            raise OwnerRuleError(f"commit of {head.key!r} by {committer!r}, "
                                 f"not its owner {head.owner!r}")
        if not check_commit(self.dir_head(head.key), head):
            return False
        self._db.execute("INSERT OR REPLACE INTO dir_heads (key, owner, seq, id) "
                         "VALUES (?, ?, ?, ?)", (head.key, head.owner, head.seq, head.record_id))
        return True

    def state_row(self, policy: str, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM policy_state WHERE policy = ? AND key = ?",
                               (policy, key)).fetchone()
        return None if row is None else bytes(row[0])

    def state_rows(self, policy: str, prefix: str) -> list[tuple[str, bytes]]:
        rows = self._db.execute("SELECT key, value FROM policy_state WHERE policy = ? "
                                "ORDER BY key", (policy,))
        return [(k, bytes(v)) for k, v in rows if k.startswith(prefix)]

    def state_write(self, policy: str, key: str, value: bytes | None) -> None:
        """Set (or with None delete) one entry of a policy's area: one commit."""
        if value is None:
            self._db.execute("DELETE FROM policy_state WHERE policy = ? AND key = ?",
                             (policy, key))
        else:
            self._db.execute("INSERT OR REPLACE INTO policy_state (policy, key, value) "
                             "VALUES (?, ?, ?)", (policy, key, value))

    def _check_declared_owner(self, head: HeadInfo) -> None:
        declared = self.roster.owners.get(head.key)
        if declared is None:
            raise OwnerRuleError(f"{head.key!r} is not a shared key of this team")
        if declared != head.owner:
            raise OwnerRuleError(f"head of {head.key!r} names owner {head.owner!r} "
                                 f"but it belongs to {declared!r}")


class PolicyStateArea:
    """One policy's durable key-value area in a :class:`SqliteStore`
    (``protocols.env.PolicyState``): values are msgpack, each write one commit."""

    def __init__(self, store: SqliteStore, policy: str) -> None:
        self._store = store
        self.policy = policy

    def get(self, key: str, default: Any = None) -> Any:
        row = self._store.state_row(self.policy, check_state_key(key))
        return default if row is None else msgpack.unpackb(row, raw=False)

    def put(self, key: str, value: Any) -> None:
        blob = msgpack.packb(value, use_bin_type=True)
        if len(blob) > MAX_STATE_VALUE_BYTES:
            raise ValueError(f"state value of {key!r}: {len(blob)} bytes, more than "
                             f"{MAX_STATE_VALUE_BYTES}")
        self._store.state_write(self.policy, check_state_key(key), blob)

    def delete(self, key: str) -> None:
        self._store.state_write(self.policy, check_state_key(key), None)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        return [(k, msgpack.unpackb(v, raw=False))
                for k, v in self._store.state_rows(self.policy, prefix)]
