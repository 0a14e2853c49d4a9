"""A node in virtual time: the node's own store, handlers, env and ops over simulated TCP.

Rules (each mirrors the node module it names; the protocol code runs unchanged):

1. Store, handlers and policy: ``nodes.store.SqliteStore`` on an in-memory database
   (:class:`SimStore`),
   ``nodes.rpc.Handlers`` serving it, ``protocols.policies.make_policy``. Only the
   store's head-log clock differs: each head change is stamped with the virtual time at
   which it appeared (:meth:`SimNode.head_log`).
2. Env: ``nodes.node_env.NodeEnv`` with virtual time (``now``, ``concurrently`` as
   kernel tasks, ``replan``) and a round meter on the virtual clock (:class:`SimMeter`,
   ``nodes.meter`` rules).
3. Client (``nodes.client``): ``fresh`` opens a connection per call (SYN, channel
   handshake frames 1 and 2, request, answer, FIN); ``reuse`` keeps one lazily opened
   connection per peer with request ids counted per connection, concurrent calls
   multiplexed; ``reuse_warm`` opens them at setup. Counters as ``nodes.transport``
   rule 4: whole frames at sender and receiver, handshake frames also on their own.
   A call with no answer within ``rpc_timeout_s`` is an ``RpcTimeout``.
4. Service times (the calibration's medians) are CPU time of the node's one CPU, queued
   behind what it already owes: half of ``handshake_ms`` before the client sends
   handshake frame 1 and half before the server answers it (the Noise KK initiator and
   responder do the same key generation and four DH operations), half of
   ``exchange_ms`` before a request is sent and half (plus ``install_ms``, or
   ``install_normal_ms`` at durability ``normal``, for an install) before it is
   answered. The server answers from the store as it is when the
   request arrives. A request the handlers reject as the peer's fault closes that
   connection; an error reply keeps it.
5. Ops as ``nodes.node`` and ``nodes.act``: ``seed``, ``update`` (timed ``on_update``),
   ``unit_end`` (timed ``at_unit_end``), ``plan`` (``derive_plan``), ``act``
   (``validate``, timed, minus replan time) with the same reply fields.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nodes.act import act_counts
from nodes.limits import Limits
from nodes.meter import HANDSHAKE_ROUND_TRIPS, HEAD_READS, RoundMeter
from nodes.node_env import NodeEnv
from nodes.rpc import Handlers, RpcCaller, SelfServingCaller
from nodes.store import PolicyStateArea, SqliteStore
from nodes.transport import Counters
from protocols.env import ActionRequest
from protocols.errors import (
    LocalProtocolError,
    RemoteCallError,
    RemoteProtocolError,
    RpcError,
)
from protocols.identity import Identity, Roster
from protocols.planning import derive_plan, own_record, replacement_plan
from protocols.policies import make_policy
from protocols.policy_rpc import PolicyContext
from protocols.records import HeadInfo
from testbed.sim import frames
from testbed.sim.calibration import Calibration
from testbed.sim.client import SimClient
from testbed.sim.kernel import NS_PER_MS, Future, Loop, gather
from testbed.sim.tcp import SERVER, Connection, TcpLayer

T = TypeVar("T")
log = logging.getLogger("testbed.sim")


class SimCaller(RpcCaller, Protocol):
    """A node's data-plane client in virtual time (this module's, or the paper's
    harness, ``testbed.sim.paper``)."""

    async def warm(self) -> int: ...


class SimStore(SqliteStore):
    """The node's store on an in-memory database: the same rules, no file on disk, so
    there is nothing to read back after an install (the check a node's file gets)."""

    def read_back(self, *args: Any, **kwargs: Any) -> str | None:
        return None


class SimMeter(RoundMeter):
    """``nodes.meter.RoundMeter`` on the virtual clock (the same rounds and phases)."""

    def __init__(self, counters: Counters, loop: Loop) -> None:
        self._loop = loop
        super().__init__(counters)

    async def measure(self, method: str, call: Callable[[], Awaitable[T]], *,
                      head_read: bool | None = None) -> T:
        is_head_read = (method in HEAD_READS) if head_read is None else head_read
        if self._in_flight == 0:
            self.rounds += 1
            self.total_rounds += 1
            self._phase = self.phase_of(method, head_read)
            self._start_bytes = self._traffic()
            self._start_ns = self._loop.now_ns
            self._start_opened = self._counters.connections_opened
        self._in_flight += 1
        self.exchanges += 1
        try:
            return await call()
        finally:
            self._in_flight -= 1
            now = self._loop.now_ns
            if is_head_read:
                self.last_head_read_ns = now
                self.last_head_round_ns = self._start_ns
            if self._in_flight == 0:
                self.bytes[self._phase] += self._traffic() - self._start_bytes
                self.ms[self._phase] += (now - self._start_ns) / 1e6
                if self._counters.connections_opened > self._start_opened:
                    self.handshake_rounds += HANDSHAKE_ROUND_TRIPS
                    self.total_handshake_rounds += HANDSHAKE_ROUND_TRIPS


class SimEnv(NodeEnv):
    """``NodeEnv`` with virtual time (rule 2)."""

    def __init__(self, loop: Loop, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loop = loop
        self.meter = SimMeter(kwargs["counters"], loop)

    def now(self) -> float:
        return self.loop.now_s()

    async def concurrently(self, calls: Sequence[Callable[[], Awaitable[T]]]
                           ) -> list[T | BaseException]:
        return await gather(self.loop, calls)

    async def replan(self, request: ActionRequest, inputs: dict[str, bytes]) -> ActionRequest:
        started = self.loop.now_ns
        self.meter.replanned = True
        try:
            if self.replan_delay_s > 0:
                await self.loop.sleep(self.replan_delay_s)
            n = self._replans.get(request.action, 0) + 1
            replacement = replacement_plan(self.identity, self.store, request, inputs, n)
            self._replans[request.action] = n
            return replacement
        finally:
            self.replan_ns += self.loop.now_ns - started


class SimNode:
    """One member of the simulated team (module rules)."""

    def __init__(self, *, loop: Loop, tcp: TcpLayer, identity: Identity, roster: Roster,
                 policy: str, connection: str, rpc_timeout_s: float,
                 calibration: Calibration, durability: str = "full",
                 client: Callable[[SimNode], SimCaller] | None = None) -> None:
        self.loop = loop
        self.tcp = tcp
        self.identity = identity
        self.roster = roster
        self.connection = connection
        self.rpc_timeout_s = rpc_timeout_s
        self.calibration = calibration
        self.install_ms = (calibration.install_ms if durability == "full"
                           else calibration.install_normal_ms)
        self.counters = Counters()
        self.store = SimStore(Path(":memory:"), agent_id=identity.agent_id, roster=roster,
                              durability="normal")
        self.policy = make_policy(policy)
        ctx = PolicyContext(agent_id=identity.agent_id, roster=roster, store=self.store,
                            state=PolicyStateArea(self.store, type(self.policy).name),
                            policy=self.policy, now=loop.now_s)
        self.handlers = Handlers(agent_id=identity.agent_id, store=self.store, roster=roster,
                                 limits=Limits.for_rpc_timeout(rpc_timeout_s),
                                 counters=self.counters)
        self.handlers.set_policy(ctx)
        self.client: SimCaller = SimClient(self) if client is None else client(self)
        caller = SelfServingCaller(agent_id=identity.agent_id, client=self.client,
                                   handlers=self.handlers)
        self.env = SimEnv(loop, identity=identity, roster=roster, store=self.store,
                          client=caller, counters=self.counters, state=ctx.state,
                          memory=ctx.memory)
        self._head_times: list[int] = []
        self._cpu_free_ns = 0  # the node's one CPU: service times queue behind each other

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    def close(self) -> None:
        self.store.close()

    # --- counters (nodes.transport rule 4) ----------------------------------------------
    def count_sent(self, size: int, *, handshake: bool = False) -> None:
        self.counters.bytes_sent += size
        self.counters.frames_sent += 1
        if handshake:
            self.counters.handshake_bytes_sent += size

    def count_received(self, size: int) -> None:
        self.counters.bytes_received += size
        self.counters.frames_received += 1

    # --- the head log on the virtual clock (rule 1) ---------------------------------------
    def _stamp_heads(self) -> None:
        count = len(self.store.head_log())
        while len(self._head_times) < count:
            self._head_times.append(self.loop.now_ns)

    def head_log(self) -> list[list[Any]]:
        self._stamp_heads()
        return [[k, s, i, t] for (k, s, i, _), t in zip(self.store.head_log(),
                                                        self._head_times, strict=True)]

    # --- server (rule 4) ------------------------------------------------------------------
    def accept(self, conn: Connection) -> None:
        state = {"peer": ""}

        def got(message: tuple[Any, ...]) -> None:
            if message[0] == "closed":  # the client closed first: nothing to answer
                return
            if message[0] == "hs1":
                state["peer"] = message[1]
                self.counters.connections_accepted += 1
                self.count_received(frames.handshake1_bytes(message[1]))
                self._after(self.calibration.handshake_ms / 2, self._send_handshake2, conn)
                return
            _, rid, method, params = message
            service = self.calibration.exchange_ms / 2 + (
                self.install_ms if method == "install" else 0.0)
            body = self.answer(state["peer"], rid, method, params)
            if body is None:  # the peer's fault: close that connection
                self._after(service, self._refuse, conn, "request rejected")
            else:
                self._after(service, self._send_answer, conn, body)

        conn.on_message(SERVER, got)

    def answer(self, peer: str, rid: int, method: str, params: dict[str, Any]
               ) -> dict[str, Any] | None:
        """The answer body to a request from PEER, as the store is now; None when the
        handlers reject it as the peer's fault (the connection closes)."""
        self.count_received(frames.request_bytes(rid, method, params))
        try:
            body: dict[str, Any] | None = {"i": rid, "r": self.handlers.answer(
                peer, method, params)}
        except RemoteCallError as exc:
            body = {"i": rid, "e": {"code": exc.code, "msg": exc.message}}
        except RemoteProtocolError:
            self.counters.rejected += 1
            body = None
        self._stamp_heads()
        return body

    def answer_size(self, body: dict[str, Any]) -> int:
        """The frame bytes of an answer body, counted as sent by this node."""
        if "e" in body:
            size = frames.error_bytes(body["i"], body["e"]["code"], body["e"]["msg"])
        else:
            size = frames.answer_bytes(body["i"], body["r"])
        self.count_sent(size)
        return size

    def _after(self, ms: float, fn: Callable[..., None], *args: Any) -> None:
        """Run FN once this node's CPU has spent MS on it (after what it already owes)."""
        self.loop.call_at(self._busy(ms), fn, *args)

    def _busy(self, ms: float) -> int:
        done = max(self.loop.now_ns, self._cpu_free_ns) + round(ms * NS_PER_MS)
        self._cpu_free_ns = done
        return done

    def cpu(self, ms: float) -> Future[None]:
        """A future that completes when this node's CPU has spent MS for the caller."""
        return self.loop.sleep_ns(self._busy(ms) - self.loop.now_ns)

    def _send_handshake2(self, conn: Connection) -> None:
        self.count_sent(frames.HANDSHAKE2_FRAME_BYTES, handshake=True)
        conn.send(SERVER, frames.HANDSHAKE2_FRAME_BYTES, ("hs2",))

    def _send_answer(self, conn: Connection, body: dict[str, Any]) -> None:
        size = self.answer_size(body)
        conn.send(SERVER, size, ("ans", size, body))

    def _refuse(self, conn: Connection, reason: str) -> None:
        log.info("closing a connection of %s: %s", self.agent_id, reason)
        conn.close(SERVER)  # the client reads the end of the stream (tcp rule 6)

    # --- ops (rule 5) ------------------------------------------------------------------------
    async def _timed_hook(self, hook: str, call: Callable[[], Awaitable[None]]
                          ) -> dict[str, Any]:
        env = self.env
        env.replan_ns = 0
        timeouts = self.counters.rpc_timeouts
        mark = env.meter.mark()
        started = self.loop.now_ns
        await call()
        elapsed = self.loop.now_ns - started - env.replan_ns
        on_path = hook not in self.policy.off_path_hooks
        return {"stall_ms": elapsed / 1e6 if on_path else 0.0,
                "rpc_timeouts": self.counters.rpc_timeouts - timeouts,
                **env.meter.rounds_since(mark if on_path else None)}

    def _traffic(self) -> int:
        return self.counters.bytes_sent + self.counters.bytes_received

    async def seed(self, key: str, content: bytes, rtype: str) -> dict[str, Any]:
        record = own_record(self.identity, key=key, seq=1, parents=[], rtype=rtype,
                            content=content)
        self.store.install(record)
        self._stamp_heads()
        await self.policy.on_seed(self.env, record.head)
        return {"head": record.head}

    async def update(self, key: str, content: bytes) -> dict[str, Any]:
        head = self.store.head(key)
        previous = None if head is None else self.store.get(head.record_id)
        if head is None or previous is None:
            raise LocalProtocolError(f"key: {key!r} has no head yet (seed it first)")
        record = own_record(self.identity, key=key, seq=head.seq + 1,
                            parents=[head.record_id], rtype=previous.rtype, content=content)
        self.store.install(record)
        self._stamp_heads()
        new_head: HeadInfo = record.head
        before = self._traffic()
        timed = await self._timed_hook("on_update",
                                       lambda: self.policy.on_update(self.env, new_head))
        return {"bytes": self._traffic() - before, **timed}

    async def unit_end(self, unit: int) -> dict[str, Any]:
        before = self._traffic()
        timed = await self._timed_hook("at_unit_end",
                                       lambda: self.policy.at_unit_end(self.env, unit))
        return {"bytes": self._traffic() - before, **timed}

    async def plan(self, *, action: str, executor: str, keys: Sequence[str], depth: int,
                   decision: str) -> dict[str, Any]:
        before = self._traffic()
        plan = await derive_plan(self.env, action=action, executor=executor, keys=keys,
                                 depth=depth, decision=decision)
        for key, record_id in plan.inputs.items():
            self.env.record_read(key, record_id)
        return {"root": plan.root, "inputs": plan.inputs, "bytes": self._traffic() - before}

    async def act(self, *, action: str, roots: tuple[bytes, ...], keys: tuple[str, ...],
                  critical: str = "") -> dict[str, Any]:
        """``nodes.act.run_act`` on the virtual clock (no deadline, no effect delay)."""
        env, counters = self.env, self.counters
        request = ActionRequest(action, roots, keys, (), critical)
        before = counters.snapshot()
        replans_before = env.replans_made
        env.replan_ns = 0
        env.meter.reset()
        started = self.loop.now_ns
        released, reason, replans = False, "", 0
        inputs: Mapping[str, bytes] = {}
        try:
            outcome = await self.policy.validate(env, request)
            released, reason = outcome.released, outcome.block_reason
            replans, inputs = outcome.replans, outcome.inputs
        except (RpcError, RemoteProtocolError) as exc:  # fail closed
            released, reason = False, f"{type(exc).__name__}: {exc}"
            replans = env.replans_made - replans_before
            inputs = {}
        decided = self.loop.now_ns
        after = counters.snapshot()
        return {
            **act_counts(released, replans, decided - started - env.replan_ns, before,
                         after),
            "inputs": dict(inputs),
            "issue_t_ns": decided,
            "block_reason": "" if released else (reason or "blocked"),
            **env.meter.report(),
        }
