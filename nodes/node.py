"""The node process: store, data-plane server, RPC client and policy, driven by control ops.

Lifecycle (see docs/architecture.md, "Control plane"):

1. The process serves only the control socket until ``configure``.
2. ``configure`` opens the store, starts the data-plane server on the node's own
   roster entry (port 0 = any free port) and the RPC client, and replies with the
   bound host/port. The controller learns every port this way, then sends
   ``configure`` again with the complete roster: a node whose identity and bind
   address did not change keeps its listener and only swaps roster, client and store.
   (The server needs only the pinned keys, which never change within a team.)
3. ``reset`` starts an episode: fresh store file, zeroed counters, closed pooled
   connections, a new policy object.

Timing attribution follows protocols/policies/base.py: act stall = elapsed time of
``validate`` minus replan time; hook stall = elapsed time unless the hook is off path.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from nodes.client import RpcClient, open_rpc_client
from nodes.control import ControlError, field
from nodes.node_env import NodeEnv
from nodes.rpc import Handlers, SelfServingCaller
from nodes.server import serve_data_plane
from nodes.store import DURABILITY_MODES, SqliteStore, remove_store_files
from nodes.transport import CONNECTION_SETTINGS, Counters
from protocols.env import ActionRequest
from protocols.errors import LocalProtocolError, RemoteProtocolError, RpcError
from protocols.identity import Identity, Roster
from protocols.planning import PlanningError, derive_plan, own_record
from protocols.policies import make_policy
from protocols.policies.base import Policy
from protocols.records import RECORD_ID_BYTES, RECORD_TYPES, Record

log = logging.getLogger("nodes.node")
PARENT_CHECK_S = 1.0
MAX_ACTION_CHARS = 120  # record keys (plan/<action>/r<n>) are capped at 200


class _Service:
    """A background task started with ``nursery.start`` that can be stopped alone."""

    def __init__(self, value: Any, scope: trio.CancelScope, done: trio.Event) -> None:
        self.value = value
        self._scope = scope
        self._done = done

    @classmethod
    async def start(cls, nursery: trio.Nursery,
                    body: Callable[..., Awaitable[None]]) -> _Service:
        """``body(task_status)`` must call ``task_status.started(value)`` once ready."""
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await body(task_status)
            finally:
                done.set()

        value = await nursery.start(run)
        return cls(value, scope, done)

    async def stop(self) -> None:
        self._scope.cancel()
        await self._done.wait()


@dataclass
class _Config:
    identity: Identity
    roster: Roster
    connection: str
    policy: str
    rpc_timeout_s: float
    durability: str
    store_path: Path
    congestion_control: str | None = None  # set per socket (rootless runs); None: default


def _ids(value: object, name: str) -> tuple[bytes, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, bytes) and len(v) == RECORD_ID_BYTES for v in value):
        raise ControlError(f"{name}: expected a list of {RECORD_ID_BYTES}-byte record IDs")
    return tuple(value)


def _strs(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ControlError(f"{name}: expected a list of non-empty strings")
    return list(value)


def _action(name: str) -> str:
    if not 0 < len(name) <= MAX_ACTION_CHARS or "/" in name:
        raise ControlError(f"action: must be 1..{MAX_ACTION_CHARS} characters without '/'")
    return name


def _congestion_control(args: Mapping[str, Any]) -> str | None:
    name = field(args, "congestion_control", (str, type(None)), default=None)
    if name is not None and not (0 < len(name) <= 15 and name.replace("_", "").isalnum()):
        raise ControlError(f"congestion_control: {name!r} is not a kernel algorithm name")
    return name  # type: ignore[no-any-return]


def _ms(ns: int) -> float:
    return ns / 1e6


class Node:
    """State and control operations of one node process."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.counters = Counters()
        self.shutdown_requested = trio.Event()
        self.cfg: _Config | None = None
        self.store: SqliteStore | None = None
        self.handlers: Handlers | None = None
        self.client: RpcClient | None = None
        self.env: NodeEnv | None = None
        self.policy: Policy | None = None
        self._server: _Service | None = None
        self._server_key: tuple[bytes, str, int] | None = None
        self._client_svc: _Service | None = None

    # --- helpers ------------------------------------------------------------------------
    def _ready(self) -> tuple[_Config, SqliteStore, NodeEnv, Policy]:
        if self.cfg is None or self.store is None or self.env is None or self.policy is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        return self.cfg, self.store, self.env, self.policy

    def _open_store(self, cfg: _Config) -> SqliteStore:
        """Replace the store by an empty one; handlers switch to it at once, so a late
        request from the previous episode never touches a closed database."""
        old = self.store
        if old is not None:
            old.close()
        remove_store_files(cfg.store_path)
        cfg.store_path.parent.mkdir(parents=True, exist_ok=True)
        self.store = SqliteStore(cfg.store_path, agent_id=cfg.identity.agent_id,
                                 roster=cfg.roster, durability=cfg.durability)
        if self.handlers is not None:
            self.handlers.store = self.store
            self.handlers.roster = cfg.roster
        return self.store

    async def _restart_client(self, cfg: _Config) -> RpcClient:
        if self._client_svc is not None:
            await self._client_svc.stop()
            self._client_svc = None

        async def body(task_status: trio.TaskStatus[RpcClient]) -> None:
            async with open_rpc_client(identity=cfg.identity, roster=cfg.roster,
                                       connection=cfg.connection,  # type: ignore[arg-type]
                                       counters=self.counters,
                                       timeout_s=cfg.rpc_timeout_s,
                                       congestion_control=cfg.congestion_control) as client:
                task_status.started(client)
                await trio.sleep_forever()

        self._client_svc = await _Service.start(self._nursery, body)
        client: RpcClient = self._client_svc.value
        self.client = client
        return client

    async def _ensure_server(self, cfg: _Config) -> tuple[str, int]:
        me = cfg.roster.members.get(cfg.identity.agent_id)
        if me is None:
            raise ControlError(f"roster: has no member {cfg.identity.agent_id!r}")
        key = (cfg.identity.seed, me.host, me.port)
        if self._server is not None and self._server_key is not None:
            seed, host, port = self._server_key
            if seed == cfg.identity.seed and host == me.host and me.port in (0, port):
                return host, port
            await self._server.stop()
            self._server = None
        assert self.handlers is not None

        async def body(task_status: trio.TaskStatus[int]) -> None:
            await serve_data_plane(identity=cfg.identity, roster=cfg.roster, host=me.host,
                                   port=me.port, handler=self.handlers_call,
                                   counters=self.counters,
                                   congestion_control=cfg.congestion_control,
                                   task_status=task_status)

        self._server = await _Service.start(self._nursery, body)
        bound: int = self._server.value
        self._server_key = (key[0], me.host, bound)
        return me.host, bound

    async def handlers_call(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        if self.handlers is None:
            raise LocalProtocolError("node is not configured")
        return await self.handlers(peer_id, method, params)

    def _new_episode_objects(self, cfg: _Config, store: SqliteStore, client: RpcClient) -> None:
        self.policy = make_policy(cfg.policy)
        if self.handlers is None:
            self.handlers = Handlers(agent_id=cfg.identity.agent_id, store=store,
                                     roster=cfg.roster)
        else:
            self.handlers.agent_id = cfg.identity.agent_id
            self.handlers.store = store
            self.handlers.roster = cfg.roster
        caller = SelfServingCaller(agent_id=cfg.identity.agent_id, client=client,
                                   handlers=self.handlers)
        self.env = NodeEnv(identity=cfg.identity, roster=cfg.roster, store=store, client=caller)

    async def close(self) -> None:
        """Stop services and close the store (called on shutdown and on signals)."""
        with trio.CancelScope(shield=True):
            for svc in (self._client_svc, self._server):
                if svc is not None:
                    await svc.stop()
            self._client_svc = self._server = None
        if self.store is not None:
            self.store.close()
            self.store = None

    # --- control ops ---------------------------------------------------------------------
    async def op_ping(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"agent_id": None if self.cfg is None else self.cfg.identity.agent_id}

    async def op_configure(self, args: Mapping[str, Any]) -> dict[str, Any]:
        agent_id = field(args, "agent_id", str)
        seed = field(args, "identity_seed", bytes)
        if len(seed) != 32:
            raise ControlError("identity_seed: must be 32 bytes")
        roster_raw = field(args, "roster", dict)
        try:
            roster = Roster.from_wire(roster_raw)
        except (KeyError, LocalProtocolError) as exc:
            raise ControlError(f"roster: malformed ({exc})") from None
        cfg = _Config(
            identity=Identity(agent_id, seed), roster=roster,
            connection=field(args, "connection", str, allowed=CONNECTION_SETTINGS),
            policy=field(args, "policy", str),
            rpc_timeout_s=float(field(args, "rpc_timeout_s", (int, float))),
            durability=field(args, "durability", str, allowed=tuple(DURABILITY_MODES)),
            store_path=Path(field(args, "store_path", str)),
            congestion_control=_congestion_control(args))
        if not cfg.rpc_timeout_s > 0:
            raise ControlError("rpc_timeout_s: must be positive")
        if roster.members.get(agent_id) is None:
            raise ControlError(f"roster: has no member {agent_id!r}")
        if roster.members[agent_id].public_key != cfg.identity.public_key:
            raise ControlError("identity_seed: does not match the roster's pinned key")
        make_policy(cfg.policy)  # validate the name before changing anything
        store = self.store
        if (store is None or self.cfg is None or store.path != cfg.store_path
                or store.durability != cfg.durability):
            store = self._open_store(cfg)
        else:
            store.roster = cfg.roster
            store.agent_id = agent_id
        self.cfg = cfg
        client = await self._restart_client(cfg)
        self._new_episode_objects(cfg, store, client)
        host, port = await self._ensure_server(cfg)
        log.info("configured %s: data plane %s:%d, policy %s, connection %s, durability %s",
                 agent_id, host, port, cfg.policy, cfg.connection, cfg.durability)
        return {"host": host, "port": port}

    async def op_reset(self, args: Mapping[str, Any]) -> dict[str, Any]:
        cfg, _, _, _ = self._ready()
        store_path = Path(field(args, "store_path", str))
        policy = field(args, "policy", str, default=cfg.policy)
        connection = field(args, "connection", str, allowed=CONNECTION_SETTINGS,
                           default=cfg.connection)
        make_policy(policy)
        cfg.store_path, cfg.policy = store_path, policy
        store = self._open_store(cfg)
        if connection != cfg.connection or self.client is None:
            cfg.connection = connection
            client = await self._restart_client(cfg)
        else:
            client = self.client
            await client.close_pooled()
        self.counters.reset()
        self._new_episode_objects(cfg, store, client)
        return {}

    async def op_seed(self, args: Mapping[str, Any]) -> dict[str, Any]:
        store = self._ready()[1]
        key = self._own_key(field(args, "key", str))
        content = field(args, "content", bytes)
        rtype = field(args, "rtype", str, default="requirement",
                      allowed=sorted(RECORD_TYPES))
        if store.head(key) is not None:
            raise ControlError(f"key: {key!r} is already seeded (use update)")
        record = self._make(key=key, seq=1, parents=[], rtype=rtype, content=content)
        store.install(record)
        _, _, env, policy = self._ready()
        await policy.on_seed(env, record.head)  # setup, never timed as stall
        return {"head": record.head.to_wire()}

    def _own_key(self, key: str) -> str:
        cfg = self.cfg
        assert cfg is not None
        owner = cfg.roster.owners.get(key)
        if owner != cfg.identity.agent_id:
            raise ControlError(f"key: {key!r} is owned by {owner!r}, not "
                               f"{cfg.identity.agent_id!r}")
        return key

    def _make(self, *, key: str, seq: int, parents: Sequence[bytes], rtype: str,
              content: bytes) -> Record:
        cfg = self.cfg
        assert cfg is not None
        try:
            return own_record(cfg.identity, key=key, seq=seq, parents=parents, rtype=rtype,
                              content=content)
        except PlanningError as exc:
            raise ControlError(str(exc)) from None

    async def _timed_hook(self, hook: str, call: Callable[[], Awaitable[None]]) -> float:
        _, _, env, policy = self._ready()
        env.replan_ns = 0
        started = time.monotonic_ns()
        await call()
        elapsed = time.monotonic_ns() - started - env.replan_ns
        return 0.0 if hook in policy.off_path_hooks else _ms(elapsed)

    async def op_update(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, store, env, policy = self._ready()
        key = self._own_key(field(args, "key", str))
        content = field(args, "content", bytes)
        head = store.head(key)
        previous = None if head is None else store.get(head.record_id)
        if head is None or previous is None:
            raise ControlError(f"key: {key!r} has no head yet (seed it first)")
        record = self._make(key=key, seq=head.seq + 1, parents=[head.record_id],
                            rtype=previous.rtype, content=content)
        store.install(record)
        t_ns = store.head_log()[-1][3]
        new_head = record.head
        stall_ms = await self._timed_hook("on_update",
                                          lambda: policy.on_update(env, new_head))
        return {"head": new_head.to_wire(), "stall_ms": stall_ms, "t_ns": t_ns}

    async def op_unit_end(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, _, env, policy = self._ready()
        unit = field(args, "unit", int)
        stall_ms = await self._timed_hook("at_unit_end", lambda: policy.at_unit_end(env, unit))
        return {"stall_ms": stall_ms}

    async def op_plan(self, args: Mapping[str, Any]) -> dict[str, Any]:
        cfg, _, env, _ = self._ready()
        action = _action(field(args, "action", str))
        executor = field(args, "executor", str)
        keys = _strs(field(args, "keys", list), "keys")
        depth = field(args, "depth", int, allowed=(0, 1), default=0)
        decision = field(args, "decision", (str, bytes), default="")
        if executor not in cfg.roster.members:
            raise ControlError(f"executor: {executor!r} is not a roster member")
        for key in keys:
            if key not in cfg.roster.owners:
                raise ControlError(f"keys: {key!r} is not a shared key")
        plan = await derive_plan(env, action=action, executor=executor, keys=keys,
                                 depth=depth, decision=decision)
        return {"root": plan.root, "inputs": plan.inputs}

    async def op_act(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, _, env, policy = self._ready()
        action = _action(field(args, "action", str))
        roots = _ids(field(args, "roots", list), "roots")
        keys = tuple(_strs(field(args, "keys", list), "keys"))
        request = ActionRequest(action, roots, keys)
        before = self.counters.snapshot()
        replans_before = env.replans_made
        env.replan_ns = 0
        started = time.monotonic_ns()
        try:
            outcome = await policy.validate(env, request)
            released, reason = outcome.released, outcome.block_reason
            replans, issued, inputs = outcome.replans, outcome.issued_roots, outcome.inputs
        except (RpcError, RemoteProtocolError) as exc:  # fail closed
            released, reason = False, f"{type(exc).__name__}: {exc}"
            replans = env.replans_made - replans_before
            issued, inputs = (), {}
        decided = time.monotonic_ns()
        after = self.counters.snapshot()
        if not released:
            log.info("act %s blocked: %s", action, reason)
        return {
            "outcome": "released" if released else "blocked",
            "replans": replans,
            "stall_ms": _ms(decided - started - env.replan_ns),
            "bytes": (after["bytes_sent"] + after["bytes_received"]
                      - before["bytes_sent"] - before["bytes_received"]),
            "connections": after["connections_opened"] - before["connections_opened"],
            "issued_roots": list(issued),
            "inputs": dict(inputs),
            "issue_t_ns": decided,
            "block_reason": "" if released else (reason or "blocked"),
        }

    async def op_counters(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return self.counters.snapshot()

    async def op_head_log(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, store, _, _ = self._ready()
        return {"log": [list(entry) for entry in store.head_log()]}

    async def op_shutdown(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def shutdown_replied(self) -> None:
        """Called by the control server once the shutdown reply has been sent."""
        self.shutdown_requested.set()


async def _watch_parent(parent_pid: int, shutdown: trio.Event) -> None:
    """Shut down if the controller that started us is gone (we were re-parented).

    (Not PR_SET_PDEATHSIG: trio starts children from a worker thread, and that signal
    fires when the *thread* exits.)
    """
    while os.getppid() == parent_pid:
        await trio.sleep(PARENT_CHECK_S)
    log.warning("parent process %d is gone: shutting down", parent_pid)
    shutdown.set()


async def run_node(control_path: str) -> None:
    """Serve the control socket until ``shutdown`` or SIGTERM/SIGINT; always clean up."""
    import signal

    from nodes.control import serve_control

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            node = Node(nursery)
            try:
                await nursery.start(serve_control, control_path, node)
                log.info("control socket ready at %s", control_path)

                async def on_signal() -> None:
                    async for signum in signals:
                        log.info("signal %d: shutting down", signum)
                        node.shutdown_requested.set()
                        return

                nursery.start_soon(on_signal)
                nursery.start_soon(_watch_parent, os.getppid(), node.shutdown_requested)
                await node.shutdown_requested.wait()
            finally:
                await node.close()
                nursery.cancel_scope.cancel()
