"""Data-plane methods: request/response schemas, server handlers, typed client calls.

Rules (the "Data plane" table of docs/architecture.md):

1. Params must have exactly the documented shape. A bad shape, an unknown method or
   a record/head that fails verification is the peer's fault: the handler raises
   :class:`RemoteProtocolError` (or :class:`IntegrityError`) and the transport closes
   that connection. Nothing from a rejected request is persisted.
2. A well-formed request this node cannot answer (unknown record ID, a key it does
   not own, a directory method at a replica) gets an error reply
   (:class:`RemoteCallError` with a stable code); the connection stays open.
3. Client helpers check every answer for the expected shape, keys and owners and
   raise :class:`IntegrityError` on a bad one, so policies see either verified data or
   an exception they turn into a block.
4. Methods a policy declares (``protocols.policy_rpc``) are served for the node's
   current policy (:attr:`Handlers.policy`): body checked against the schema (a bad one
   closes the connection as in rule 1), then the policy's handler; a handler's own
   failure is answered with error ``policy_fault`` on that request alone and logged.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from nodes.limits import Limits
from nodes.store import SqliteStore
from nodes.transport import Counters
from protocols.errors import (
    IntegrityError,
    LocalProtocolError,
    RemoteCallError,
    RemoteProtocolError,
)
from protocols.heads import UNKNOWN_ID, EquivocationError
from protocols.identity import CENTRAL_ID, Roster
from protocols.policy_rpc import POLICY_FAULT, PolicyContext, PolicyFault, Rpc, serve
from protocols.policy_schema import to_wire
from protocols.records import (
    MAX_RECORDS_PER_INSTALL,
    RECORD_ID_BYTES,
    HeadInfo,
    Record,
    verify_record,
)

log = logging.getLogger("nodes.rpc")

MAX_KEYS_PER_CALL = 4096

# Error codes of rule 2.
NOT_OWNER = "not_owner"
NO_HEAD = "no_head"
NOT_CENTRAL = "not_central"
STORE_FAILED = "store_failed"  # this node's own store failed (disk full): not the peer


class RpcCaller(Protocol):
    """What the transport's client offers (``nodes.transport`` RpcClient)."""

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any: ...


# --- param validation --------------------------------------------------------------------
def _exact(params: object, fields: set[str], method: str) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise RemoteProtocolError(f"{method}: params must be a map")
    if set(params) != fields:
        raise RemoteProtocolError(f"{method}: params must be exactly {sorted(fields)}, "
                                  f"got {sorted(map(str, params))}")
    return params


def _keys(params: object, method: str) -> list[str]:
    keys = _exact(params, {"keys"}, method)["keys"]
    if not isinstance(keys, list) or not 0 < len(keys) <= MAX_KEYS_PER_CALL \
            or not all(isinstance(k, str) and k for k in keys):
        raise RemoteProtocolError(f"{method}: keys must be 1..{MAX_KEYS_PER_CALL} "
                                  f"non-empty strings")
    if len(set(keys)) != len(keys):
        raise RemoteProtocolError(f"{method}: duplicate keys")
    return keys


def _heads(params: object, method: str) -> list[HeadInfo]:
    raw = _exact(params, {"heads"}, method)["heads"]
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_KEYS_PER_CALL:
        raise RemoteProtocolError(f"{method}: heads must be a list of 1..{MAX_KEYS_PER_CALL}")
    return [HeadInfo.from_wire(h) for h in raw]


# --- server side ----------------------------------------------------------------------------
class Handlers:
    """Serves the data-plane methods over the node's current store and roster.

    The node swaps ``store``/``roster`` on reset/configure; handlers always read the
    current ones. :meth:`new_episode` zeroes the per-peer install quotas. Every method
    is synchronous (SQLite is), so the server answers it inline (:meth:`answer`, the
    transport's ``sync_handler``) without a task per request; awaiting the object
    itself gives the same answer.
    """

    def __init__(self, *, agent_id: str, store: SqliteStore, roster: Roster,
                 limits: Limits | None = None, counters: Counters | None = None) -> None:
        self.agent_id = agent_id
        self.store = store
        self.roster = roster
        self.limits = limits or Limits()
        self.counters = counters or Counters()
        self.installed: dict[str, tuple[int, int]] = {}  # peer -> (records, bytes) this episode
        self._table: dict[str, Callable[[str, object], dict[str, Any]]] = {
            "heads": self._heads, "fetch": self._fetch, "install": self._install,
            "versions": self._versions, "commit": self._commit, "dir_heads": self._dir_heads,
            "ping": self._ping,
        }
        #: The current policy's methods and what their handlers see (rule 4).
        self.policy: PolicyContext | None = None
        self.policy_rpcs: dict[str, Rpc] = {}
        self.policy_faults = 0

    def set_policy(self, ctx: PolicyContext) -> None:
        self.policy = ctx
        self.policy_rpcs = {rpc.name: rpc for rpc in type(ctx.policy).rpcs}

    def new_episode(self) -> None:
        self.installed = {}

    async def __call__(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        return self.answer(peer_id, method, params)

    def answer(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        handler = self._table.get(method)
        try:
            if handler is None:
                return self._policy_method(peer_id, method, params)
            return handler(peer_id, params)
        except sqlite3.Error as exc:  # our store failed (e.g. a full disk): say so
            raise RemoteCallError(STORE_FAILED, f"{type(exc).__name__}: {exc}") from None
        except RemoteProtocolError as exc:  # includes IntegrityError: connection closes
            if isinstance(exc, EquivocationError):
                self.counters.equivocations += 1
            log.warning("rejected %s from %s: %s: %s", method, peer_id,
                        type(exc).__name__, exc)
            raise

    def _ping(self, peer: str, params: object) -> dict[str, Any]:
        """Proves a warmed connection (``reuse_warm``): the server holds a connection
        without an authenticated frame for ``first_frame_timeout_s`` only."""
        _exact(params, set(), "ping")
        return {}

    def _heads(self, peer: str, params: object) -> dict[str, Any]:
        keys = _keys(params, "heads")
        out = []
        for key in keys:
            if self.roster.owners.get(key) != self.agent_id:
                raise RemoteCallError(NOT_OWNER, f"{self.agent_id} does not own {key!r}")
            head = self.store.head(key)
            if head is None:
                raise RemoteCallError(NO_HEAD, f"{key!r} has no head yet")
            out.append(head.to_wire())
        return {"heads": out}

    def _fetch(self, peer: str, params: object) -> dict[str, Any]:
        rid = _exact(params, {"id"}, "fetch")["id"]
        if not isinstance(rid, bytes) or len(rid) != RECORD_ID_BYTES:
            raise RemoteProtocolError(f"fetch: id must be {RECORD_ID_BYTES} bytes")
        record = self.store.get(rid)
        if record is None:
            raise RemoteCallError(UNKNOWN_ID, f"no record {rid.hex()[:16]}")
        return {"record": record.to_wire()}

    def _install(self, peer: str, params: object) -> dict[str, Any]:
        raw = _exact(params, {"records"}, "install")["records"]
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_RECORDS_PER_INSTALL:
            raise RemoteProtocolError(f"install: records must be a list of "
                                      f"1..{MAX_RECORDS_PER_INSTALL}")
        records = [Record.from_wire(r) for r in raw]
        if peer != self.agent_id:  # a node's calls to itself carry no quota
            count, size = self.installed.get(peer, (0, 0))
            count += len(records)
            size += sum(len(r.content) for r in records)
            limits = self.limits
            if count > limits.install_records_per_peer or size > limits.install_bytes_per_peer:
                raise RemoteProtocolError(
                    f"install quota of this episode exceeded ({count} records, {size} "
                    f"bytes; install_records_per_peer {limits.install_records_per_peer}, "
                    f"install_bytes_per_peer {limits.install_bytes_per_peer})")
            installed = self.store.install_many(records)
            self.installed[peer] = (count, size)
            counters = self.counters
            counters.peak_install_records = max(counters.peak_install_records, count)
            counters.peak_install_bytes = max(counters.peak_install_bytes, size)
            return {"installed": installed}
        return {"installed": self.store.install_many(records)}

    def _policy_method(self, peer: str, method: str, params: dict[str, Any]) -> Any:
        rpc = self.policy_rpcs.get(method)
        if rpc is None or self.policy is None:
            raise RemoteProtocolError(f"unknown method {method!r}")
        try:
            return serve(rpc, self.policy, peer, params)
        except PolicyFault as exc:  # the policy's bug: this request fails, nothing else
            self.policy_faults += 1
            log.warning("policy %s: handler of %r from %s failed: %s",
                        type(self.policy.policy).name, method, peer, exc)
            raise RemoteCallError(POLICY_FAULT, str(exc)) from None

    def _versions(self, peer: str, params: object) -> dict[str, Any]:
        keys = _keys(params, "versions")
        return {"heads": [h.to_wire() for h in map(self.store.latest, keys) if h is not None]}

    def _commit(self, peer: str, params: object) -> dict[str, Any]:
        heads = _heads(params, "commit")
        if self.agent_id != CENTRAL_ID:
            raise RemoteCallError(NOT_CENTRAL, f"{self.agent_id} is not the directory")
        for head in heads:
            self.store.dir_commit(head, committer=peer)
        return {"ack": True}

    def _dir_heads(self, peer: str, params: object) -> dict[str, Any]:
        keys = _keys(params, "dir_heads")
        if self.agent_id != CENTRAL_ID:
            raise RemoteCallError(NOT_CENTRAL, f"{self.agent_id} is not the directory")
        return {"heads": [h.to_wire() for h in map(self.store.dir_head, keys)
                          if h is not None]}


# --- client side ------------------------------------------------------------------------------
class SelfServingCaller:
    """Routes calls addressed to this node to its own handlers: no socket, no bytes.

    The channel refuses a handshake with oneself, and a node asking itself (an owner
    validating its own key, a planner that owns an input) has nothing to send over a
    link, so such calls never touch the network or the traffic counters.
    """

    def __init__(self, *, agent_id: str, client: RpcCaller, handlers: Handlers) -> None:
        self.agent_id = agent_id
        self.client = client
        self.handlers = handlers

    async def call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        if peer_id == self.agent_id:
            return await self.handlers(peer_id, method, params)
        return await self.client.call(peer_id, method, params)


def _result_field(result: object, field: str, method: str) -> Any:
    if not isinstance(result, Mapping) or field not in result:
        raise IntegrityError(f"{method}: answer lacks {field!r}")
    return result[field]


def _answer_heads(result: object, method: str, keys: Sequence[str], roster: Roster,
                  *, owner: str | None, complete: bool) -> dict[str, HeadInfo]:
    """Decode and check heads: only requested keys, declared owners, no duplicates."""
    raw = _result_field(result, "heads", method)
    if not isinstance(raw, list):
        raise IntegrityError(f"{method}: heads is not a list")
    wanted = set(keys)
    out: dict[str, HeadInfo] = {}
    for item in raw:
        try:
            head = HeadInfo.from_wire(item)
        except RemoteProtocolError as exc:
            raise IntegrityError(f"{method}: {exc}") from None
        if head.key not in wanted or head.key in out:
            raise IntegrityError(f"{method}: unexpected or repeated key {head.key!r}")
        declared = roster.owners.get(head.key)
        if declared is not None and head.owner != declared:
            raise IntegrityError(f"{method}: {head.key!r} reported with owner "
                                 f"{head.owner!r}, declared {declared!r}")
        if owner is not None and head.owner != owner:
            raise IntegrityError(f"{method}: {owner} answered for {head.key!r} "
                                 f"owned by {head.owner!r}")
        out[head.key] = head
    if complete and len(out) != len(wanted):
        missing = sorted(wanted - set(out))
        raise IntegrityError(f"{method}: answer omits {missing}")
    return out


async def call_heads(client: RpcCaller, roster: Roster, owner: str,
                     keys: Sequence[str]) -> dict[str, HeadInfo]:
    result = await client.call(owner, "heads", {"keys": list(keys)})
    return _answer_heads(result, "heads", keys, roster, owner=owner, complete=True)


async def call_fetch(client: RpcCaller, roster: Roster, peer: str, record_id: bytes) -> Record:
    result = await client.call(peer, "fetch", {"id": record_id})
    try:
        record = Record.from_wire(_result_field(result, "record", "fetch"))
    except RemoteProtocolError as exc:
        raise IntegrityError(f"fetch: {exc}") from None
    verify_record(record, roster, expected_id=record_id)
    return record


async def call_install(client: RpcCaller, peer: str, records: Sequence[Record]) -> int:
    result = await client.call(peer, "install", {"records": [r.to_wire() for r in records]})
    installed = _result_field(result, "installed", "install")
    if not isinstance(installed, int) or isinstance(installed, bool) \
            or not 0 <= installed <= len(records):
        raise IntegrityError(f"install: bad count {installed!r}")
    return installed


async def _call_ack(client: RpcCaller, peer: str, method: str,
                    heads: Sequence[HeadInfo]) -> None:
    result = await client.call(peer, method, {"heads": [h.to_wire() for h in heads]})
    if _result_field(result, "ack", method) is not True:
        raise IntegrityError(f"{method}: not acknowledged")


async def call_commit(client: RpcCaller, heads: Sequence[HeadInfo]) -> None:
    await _call_ack(client, CENTRAL_ID, "commit", heads)


async def call_versions(client: RpcCaller, roster: Roster, peer: str,
                        keys: Sequence[str]) -> dict[str, HeadInfo]:
    result = await client.call(peer, "versions", {"keys": list(keys)})
    return _answer_heads(result, "versions", keys, roster, owner=None, complete=False)


async def call_dir_heads(client: RpcCaller, roster: Roster,
                         keys: Sequence[str]) -> dict[str, HeadInfo]:
    result = await client.call(CENTRAL_ID, "dir_heads", {"keys": list(keys)})
    return _answer_heads(result, "dir_heads", keys, roster, owner=None, complete=False)


async def call_policy(client: RpcCaller, peer: str, rpc: Rpc, body: Mapping[str, Any]) -> Any:
    """One request of a policy-defined method; the answer checked against its schema
    (a bad answer is the peer's fault: :class:`IntegrityError`)."""
    params = to_wire(body)
    try:
        rpc.request.check(params, rpc.name)
    except RemoteProtocolError as exc:  # we built it: our own (the policy's) mistake
        raise LocalProtocolError(f"policy body: {exc}") from None
    result = await client.call(peer, rpc.name, params)
    if rpc.response is None:
        return result
    try:
        return rpc.response.check(result, f"{rpc.name} answer")
    except RemoteProtocolError as exc:
        raise IntegrityError(str(exc)) from None
