"""The node process: store, data-plane server, RPC client and policy, driven by control ops.

Lifecycle (see docs/architecture.md, "Control plane"):

1. The process serves only the control socket until ``configure``.
2. ``configure`` opens the store, starts the data-plane server on the node's own
   roster entry (port 0 = any free port) and the RPC client, and replies with the
   bound host/port. The controller learns every port this way, then sends
   ``configure`` again with the complete roster: a node whose bind address did not
   change keeps its listener and only swaps identity, roster, client and store.
3. ``reset`` starts an episode: fresh store file, zeroed counters, closed pooled
   connections, a new policy object, and (episode binding) the episode's own
   identity and roster when the controller sends them: the server closes every
   connection of the previous episode and keeps its bound port.

Timing attribution follows protocols/policies/base.py: act stall = elapsed time of
``validate`` minus replan time; hook stall = elapsed time unless the hook is off path.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from nodes.act import run_act
from nodes.client import RpcClient, open_rpc_client
from nodes.control import ControlError, field
from nodes.limits import Limits, LimitsError
from nodes.live_ops import LiveOps
from nodes.log_ops import LogOps
from nodes.node_config import (
    NodeConfig,
    action_name,
    check_identity,
    congestion_control_arg,
    episode_identity,
    ms_of_ns,
    nonempty_strs,
    record_ids,
)
from nodes.node_env import NodeEnv
from nodes.rpc import Handlers, SelfServingCaller
from nodes.sched_probe import SchedProbe
from nodes.server import DataPlaneServer, serve_data_plane
from nodes.service import Service, watch_parent
from nodes.store import DURABILITY_MODES, PolicyStateArea, SqliteStore, remove_store_files
from nodes.store_check import CHECK_INTERVAL_S
from nodes.transport import CONNECTION_SETTINGS, Counters
from nodes.wire_ops import WireOps
from protocols.errors import LocalProtocolError
from protocols.identity import Identity, Roster
from protocols.planning import PlanningError, current_inputs, derive_plan, own_record
from protocols.policies import make_policy
from protocols.policies.base import Policy
from protocols.policy_rpc import PolicyContext
from protocols.records import RECORD_TYPES, Record

log = logging.getLogger("nodes.node")


class Node(LiveOps, WireOps, LogOps):
    """State and control operations of one node process."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.counters = Counters()
        self.shutdown_requested = trio.Event()
        self.cfg: NodeConfig | None = None
        self.store: SqliteStore | None = None
        self.handlers: Handlers | None = None
        #: Every data-plane request this node answered: (caller, method, answered_ns).
        self.served_log: list[tuple[str, str, int]] = []
        self.client: RpcClient | None = None
        self.env: NodeEnv | None = None
        self.policy: Policy | None = None
        self.limits = Limits()
        self._server: Service | None = None
        self._server_state: DataPlaneServer | None = None
        self._server_key: tuple[str, int] | None = None
        self._client_svc: Service | None = None
        #: This process's scheduling delay per episode (nodes/sched_probe.py).
        self.sched = SchedProbe()
        #: Why the node ended on its own (its store failed its read-back), else None.
        self.fatal: str | None = None

    # --- helpers ------------------------------------------------------------------------
    def _ready(self) -> tuple[NodeConfig, SqliteStore, NodeEnv, Policy]:
        if self.cfg is None or self.store is None or self.env is None or self.policy is None:
            raise ControlError("op: node is not configured yet (send configure first)")
        return self.cfg, self.store, self.env, self.policy

    async def watch_store(self) -> None:
        """Read the store back from disk every ``CHECK_INTERVAL_S`` (nodes/store_check.py);
        a store overwritten under the node ends it with the reason (it never goes on
        serving from memory)."""
        while True:
            await trio.sleep(CHECK_INTERVAL_S)
            store = self.store
            reason = None if store is None else store.read_back(replaced=True)
            if reason is not None and store is self.store:
                self.fatal = f"store_failed: {reason}"
                log.error("store read back failed: %s; the node ends", reason)
                self.shutdown_requested.set()
                return

    def _open_store(self, cfg: NodeConfig) -> SqliteStore:
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

    async def _restart_client(self, cfg: NodeConfig) -> RpcClient:
        if self._client_svc is not None:
            await self._client_svc.stop()
            self._client_svc = None

        async def body(task_status: trio.TaskStatus[RpcClient]) -> None:
            async with open_rpc_client(identity=cfg.identity, roster=cfg.roster,
                                       connection=cfg.connection,
                                       counters=self.counters,
                                       timeout_s=cfg.rpc_timeout_s,
                                       congestion_control=cfg.congestion_control) as client:
                task_status.started(client)
                await trio.sleep_forever()

        self._client_svc = await Service.start(self._nursery, body)
        client: RpcClient = self._client_svc.value
        self.client = client
        return client

    async def _ensure_server(self, cfg: NodeConfig) -> tuple[str, int]:
        """Serve on our roster entry; a kept bind address keeps the listener (rekeyed)."""
        me = cfg.roster.members.get(cfg.identity.agent_id)
        if me is None:
            raise ControlError(f"roster: has no member {cfg.identity.agent_id!r}")
        state = self._server_state
        if self._server is not None and self._server_key is not None and state is not None:
            host, port = self._server_key
            if host == me.host and me.port in (0, port):
                if state.identity != cfg.identity or state.roster != cfg.roster:
                    state.rekey(cfg.identity, cfg.roster)
                state.limits = self.limits
                return host, port
            await self._server.stop()
            self._server = None
        state = self._server_state = DataPlaneServer(
            identity=cfg.identity, roster=cfg.roster, sync_handler=self.handlers_answer,
            counters=self.counters, limits=self.limits)

        async def body(task_status: trio.TaskStatus[int]) -> None:
            await serve_data_plane(server=state, host=me.host, port=me.port,
                                   congestion_control=cfg.congestion_control,
                                   task_status=task_status)

        self._server = await Service.start(self._nursery, body)
        bound: int = self._server.value
        self._server_key = (me.host, bound)
        return me.host, bound

    def handlers_answer(self, peer_id: str, method: str, params: dict[str, Any]) -> Any:
        if self.handlers is None:
            raise LocalProtocolError("node is not configured")
        self.served_log.append((peer_id, method, time.monotonic_ns()))
        return self.handlers.answer(peer_id, method, params)

    def _new_episode_objects(self, cfg: NodeConfig, store: SqliteStore, client: RpcClient) -> None:
        self.policy = make_policy(cfg.policy)
        ctx = PolicyContext(agent_id=cfg.identity.agent_id, roster=cfg.roster, store=store,
                            state=PolicyStateArea(store, type(self.policy).name),
                            policy=self.policy, now=time.monotonic)
        if self.handlers is None:
            self.handlers = Handlers(agent_id=cfg.identity.agent_id, store=store,
                                     roster=cfg.roster, limits=self.limits,
                                     counters=self.counters)
        else:
            self.handlers.agent_id = cfg.identity.agent_id
            self.handlers.store = store
            self.handlers.roster = cfg.roster
            self.handlers.limits = self.limits
        self.handlers.new_episode()
        self.handlers.set_policy(ctx)
        caller = SelfServingCaller(agent_id=cfg.identity.agent_id, client=client,
                                   handlers=self.handlers)
        self.env = NodeEnv(identity=cfg.identity, roster=cfg.roster, store=store, client=caller,
                           counters=self.counters, state=ctx.state, memory=ctx.memory)
        self.attach_live(self.env)

    async def close(self) -> None:
        """Stop services and close the store (called on shutdown and on signals)."""
        with trio.CancelScope(shield=True):
            await self.close_live()
            for svc in (self._client_svc, self._server):
                if svc is not None:
                    await svc.stop()
            self._client_svc = self._server = None
        if self.store is not None:
            self.store.close()
            self.store = None

    # --- control ops ---------------------------------------------------------------------
    async def op_ping(self, args: Mapping[str, Any]) -> dict[str, Any]:
        # t_ns: when this node handled the ping (the controller's liveness, rule 3 of
        # testbed/run/liveness.py; CLOCK_MONOTONIC is system wide)
        return {"agent_id": None if self.cfg is None else self.cfg.identity.agent_id,
                "t_ns": time.monotonic_ns()}

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
        cfg = NodeConfig(
            identity=Identity(agent_id, seed), roster=roster,
            connection=field(args, "connection", str, allowed=CONNECTION_SETTINGS),
            policy=field(args, "policy", str),
            rpc_timeout_s=float(field(args, "rpc_timeout_s", (int, float))),
            durability=field(args, "durability", str, allowed=tuple(DURABILITY_MODES)),
            store_path=Path(field(args, "store_path", str)),
            congestion_control=congestion_control_arg(args))
        if not cfg.rpc_timeout_s > 0:
            raise ControlError("rpc_timeout_s: must be positive")
        check_identity(cfg.identity, roster)
        make_policy(cfg.policy)  # validate the name before changing anything
        try:
            limits = Limits.for_rpc_timeout(cfg.rpc_timeout_s).override(
                field(args, "limits", dict, default={}))
        except LimitsError as exc:
            raise ControlError(str(exc)) from None
        self.limits = limits
        self.configure_wire_encoding(args)
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
        rekeyed = episode_identity(args, cfg)
        cfg.store_path, cfg.policy = store_path, policy
        if rekeyed is not None:
            cfg.identity, cfg.roster = rekeyed
            if self.store is not None:
                self.store.roster = cfg.roster
            await self._ensure_server(cfg)  # same listener; old connections closed
        store = self._open_store(cfg)
        if connection != cfg.connection or self.client is None:
            cfg.connection = connection
            client = await self._restart_client(cfg)
        else:
            client = self.client
            await client.rekey(cfg.identity, cfg.roster)
        self.counters.reset()
        self.served_log.clear()
        self._new_episode_objects(cfg, store, client)
        self.sched.reset()
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
        return {"head": record.head.to_wire("msgpack")}

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

    def _traffic(self) -> int:
        return self.counters.bytes_sent + self.counters.bytes_received

    async def _timed_hook(self, hook: str, call: Callable[[], Awaitable[None]]
                          ) -> dict[str, Any]:
        """The hook's ``stall_ms`` and rounds (0 off path), the ``rpc_timeouts`` inside it."""
        _, _, env, policy = self._ready()
        env.replan_ns = 0
        timeouts = self.counters.rpc_timeouts
        mark = env.meter.mark()
        started = time.monotonic_ns()
        await call()
        elapsed = time.monotonic_ns() - started - env.replan_ns
        on_path = hook not in policy.off_path_hooks
        return {"stall_ms": ms_of_ns(elapsed) if on_path else 0.0,
                "rpc_timeouts": self.counters.rpc_timeouts - timeouts,
                **env.meter.rounds_since(mark if on_path else None)}

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
        before = self._traffic()
        timed = await self._timed_hook("on_update", lambda: policy.on_update(env, new_head))
        return {"head": new_head.to_wire("msgpack"), "t_ns": t_ns, "bytes": self._traffic() - before,
                **timed}

    async def op_unit_end(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, _, env, policy = self._ready()
        unit = field(args, "unit", int)
        before = self._traffic()
        timed = await self._timed_hook("at_unit_end", lambda: policy.at_unit_end(env, unit))
        return {"bytes": self._traffic() - before, **timed}

    async def op_plan(self, args: Mapping[str, Any]) -> dict[str, Any]:
        cfg, _, env, _ = self._ready()
        action = action_name(field(args, "action", str))
        executor = field(args, "executor", str)
        keys = nonempty_strs(field(args, "keys", list), "keys")
        depth = field(args, "depth", int, allowed=(0, 1), default=0)
        decision = field(args, "decision", (str, bytes), default="")
        if executor not in cfg.roster.members:
            raise ControlError(f"executor: {executor!r} is not a roster member")
        for key in keys:
            if key not in cfg.roster.owners:
                raise ControlError(f"keys: {key!r} is not a shared key")
        before = self._traffic()
        plan = await derive_plan(env, action=action, executor=executor, keys=keys,
                                 depth=depth, decision=decision)
        for key, record_id in plan.inputs.items():  # the planner's session read them
            env.record_read(key, record_id)
        return {"root": plan.root, "inputs": plan.inputs, "bytes": self._traffic() - before}

    async def op_read(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Retrieve the owners' current versions of ``keys`` into the store; the session
        records them as read (an executor that has seen a revision). The reply carries
        the round meter's report: ``fetch_ms`` is the time of the content transfer."""
        cfg, _, env, _ = self._ready()
        keys = nonempty_strs(field(args, "keys", list), "keys")
        for key in keys:
            if key not in cfg.roster.owners:
                raise ControlError(f"keys: {key!r} is not a shared key")
        env.meter.reset()
        records = await current_inputs(env, keys)
        for record in records:
            env.record_read(record.key, record.id)
        return {"inputs": {r.key: r.id for r in records}, **env.meter.report()}

    async def op_act(self, args: Mapping[str, Any]) -> dict[str, Any]:
        _, _, env, policy = self._ready()
        action = action_name(field(args, "action", str))
        roots = record_ids(field(args, "roots", list), "roots")
        keys = tuple(nonempty_strs(field(args, "keys", list), "keys"))
        return await run_act(env, policy, self.counters, action, roots, keys, args)

    async def op_verify_store(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Read the store back from disk now (the controller asks at each episode's
        end): ``reason`` is empty when its files are the ones it wrote."""
        store = self._ready()[1]
        reason = store.read_back()
        if reason is not None:
            log.error("store read back failed: %s", reason)
        return {"reason": reason or ""}

    async def op_counters(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return self.counters.snapshot()

    async def op_sched(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """This process's scheduling delay since ``reset`` or the last ``restart``."""
        report = self.sched.report()
        if field(args, "restart", bool, default=False):
            self.sched.reset()
        return report

    async def op_shutdown(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def shutdown_replied(self) -> None:
        """Called by the control server once the shutdown reply has been sent."""
        self.shutdown_requested.set()


async def run_node(control_path: str, parent_pid: int | None = None) -> str | None:
    """Serve the control socket until ``shutdown`` or SIGTERM/SIGINT; always clean up.
    Returns why the node ended on its own (:attr:`Node.fatal`), else None."""
    import signal

    from nodes.control import serve_control

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            node = Node(nursery)
            node.sched.start()
            try:
                await nursery.start(serve_control, control_path, node)
                log.info("control socket ready at %s", control_path)

                async def on_signal() -> None:
                    async for signum in signals:
                        log.info("signal %d: shutting down", signum)
                        node.shutdown_requested.set()
                        return

                nursery.start_soon(on_signal)
                nursery.start_soon(watch_parent, parent_pid or os.getppid(),
                                   node.shutdown_requested)
                nursery.start_soon(node.watch_store)
                await node.shutdown_requested.wait()
            finally:
                node.sched.stop()
                await node.close()
                nursery.cancel_scope.cancel()
    return node.fatal
