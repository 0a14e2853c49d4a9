"""Controller side of the node processes: start them, configure them, drive them.

One ``python -m nodes`` process per agent (plus ``central`` when asked), forked by the
team's zygote (testbed/run/node_spawner.py) and supervised in the team's nursery,
optionally inside a network namespace. Each node's control socket gets one persistent
connection (one request at a time). Setup follows the two-step ``configure`` of
docs/architecture.md: first every node binds its data-plane port (port 0 in the
roster), then every node receives the complete roster. ``reset_all`` starts a new episode cheaply (fresh store file, zeroed
counters, closed pooled connections, new policy object) without restarting processes,
and binds the episode: every member's key is derived from the campaign seed, this
team's random incarnation and the episode label, and the whole roster is re-pinned at
every node (docs/architecture.md, "Threat model"), so nothing signed or handshaken in
another episode, team or campaign verifies in this one.

On exit the team asks each node to shut down, waits briefly, then terminates
(SIGTERM, later SIGKILL) only the processes it started.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import shutil
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from nodes.control import ControlClient
from nodes.store import DURABILITY_MODES
from nodes.transport import CONNECTION_SETTINGS, Connection
from protocols.errors import RemoteProtocolError
from protocols.identity import CENTRAL_ID, Identity, Member, Roster
from testbed.errors import RunFailure
from testbed.host.ledger import Ledger
from testbed.host.processes import cpu_seconds, is_running
from testbed.run import node_spawner as spawning
from testbed.run.liveness import Watched, watch_all
from testbed.run.startup import STARTUP_FLOOR_S, StartupClock, measure_start_s, usable_cpus
from testbed.run.startup import startup_timeout_s as startup_timeout

log = logging.getLogger("testbed.run.team")

T = TypeVar("T")
SHUTDOWN_GRACE_S = 5.0
HEARTBEAT_MIN_S = 1.0
OP_DEADLINE_MARGIN_S = 5.0
#: Control ops that run no policy code: they get op_deadline_s.
LOCAL_OPS = frozenset({"ping", "reset", "counters", "head_log", "install_log", "rpc_log",
                       "configure", "sched"})
CONNECTIONS: tuple[Connection, ...] = CONNECTION_SETTINGS
DURABILITIES: tuple[str, ...] = tuple(DURABILITY_MODES)


class NodeDied(RunFailure):
    """A node process exited (or its control socket broke) while the team needed it."""


class NodeUnresponsive(RunFailure):
    """A node stopped answering its control plane (frozen, or stuck); its message
    starts with ``node_unresponsive``, the abort reason of the episode."""

    def __init__(self, agent: str, detail: str) -> None:
        super().__init__(f"node_unresponsive: {agent} {detail}")
        self.agent = agent


def heartbeat_timeout_s(rpc_timeout_s: float) -> float:
    """How long a live node may take to answer a ping: half the RPC timeout (so a frozen
    node is found before the RPCs to it time out), at least 1 s."""
    return max(HEARTBEAT_MIN_S, rpc_timeout_s / 2)


def op_deadline_s(rpc_timeout_s: float) -> float:
    """Deadline of a control op that runs no policy (ping, reset, counters, head_log):
    such an op is local work, so it never needs an RPC timeout, let alone this."""
    return rpc_timeout_s + OP_DEADLINE_MARGIN_S


class NodeOpError(RunFailure):
    """A node refused or failed a control op; the message is the node's reason."""

    def __init__(self, agent: str, op: str, error: str) -> None:
        super().__init__(f"{agent}: {op}: {error}")
        self.agent, self.op, self.error = agent, op, error


def key_names(n_keys: int) -> list[str]:
    """The shared keyspace X: ``k000``, ``k001``, ..."""
    return [f"k{i:03d}" for i in range(n_keys)]


def key_owners(agents: Sequence[str], n_keys: int) -> dict[str, str]:
    """Round-robin ownership of ``n_keys`` keys over ``agents``."""
    if not agents:
        raise ValueError("agents: at least one agent is needed")
    return {key: agents[i % len(agents)] for i, key in enumerate(key_names(n_keys))}


def _make_dirs(*paths: Path) -> None:
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)


def _exited(node: _Node) -> bool:
    return node.process is not None and node.process.poll() is not None


@dataclass
class _Node:
    agent: str
    netns: str | None
    bind_host: str
    control_path: str
    log_path: Path
    store_path: Path
    process: trio.Process | spawning.ForkedProcess | None = None
    client: ControlClient | None = None
    heartbeat: ControlClient | None = None  # a second connection, for pings only
    unresponsive: bool = False
    returncode: int | None = None
    port: int = 0


@dataclass
class Team:
    """A running team; create with :func:`open_team`."""

    agents: list[str]
    central: bool
    campaign_seed: int | str
    connection: Connection
    policy: str
    durability: str
    rpc_timeout_s: float
    owners: dict[str, str]
    probes: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    congestion_control: str | None = None  # set per socket by the nodes (rootless runs)
    limits: dict[str, Any] = field(default_factory=dict)
    ledger: Ledger | None = None
    wire_encoding: str = "msgpack"  # records and head entries on the wire (protocols.records)
    #: How long a node may take to open its control socket (testbed.run.startup).
    startup_timeout_s: float = STARTUP_FLOOR_S
    roster: Roster = field(init=False)
    #: Key material, never a measurement: random per team, so that a rerun, a resumed
    #: run or another campaign with the same seed never derives this team's keys.
    incarnation: str = field(default_factory=lambda: secrets.token_hex(16))
    episode: str = "setup"  # the label the current keys are bound to
    episodes_started: int = 0
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _closing: bool = False
    _spawner: spawning.NodeSpawner | None = None  # the nodes' zygote (None: exec each)

    # --- public ------------------------------------------------------------------------
    @property
    def members(self) -> list[str]:
        """Agents whose processes this team runs (agents, then central)."""
        return list(self._nodes)

    def identity(self, agent: str) -> Identity:
        """The current episode's identity of a member or a probe (tests and benchmarks
        act as a probe with it)."""
        return Identity.derive(agent, self.campaign_seed,
                               episode=f"{self.incarnation}/{self.episode}")

    def pid(self, agent: str) -> int | None:
        """The process id of a member's node (fault injection and tests), None if gone."""
        process = self._nodes[agent].process
        return None if process is None or process.returncode is not None else process.pid

    def dead_members(self) -> list[str]:
        """Members whose process has exited (a failure's first suspect)."""
        return [a for a, n in self._nodes.items()
                if n.returncode is not None
                or (n.process is not None and (n.process.poll() is not None
                                               or not is_running(n.process.pid, None)))]

    def log_path(self, agent: str) -> Path:
        return self._nodes[agent].log_path

    def store_path(self, agent: str) -> Path:
        """A member's store file (fault injection and tests)."""
        return self._nodes[agent].store_path

    def control_path(self, agent: str) -> str:
        """A member's control socket, for a connection of the caller's own (a long-poll op
        beside the one that runs the member's current op)."""
        return self._nodes[agent].control_path

    def log_tail(self, agent: str, lines: int = 20) -> str:
        try:
            with open(self._nodes[agent].log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    async def call(self, agent: str, op: str, **args: Any) -> dict[str, Any]:
        """Run one control op at ``agent``; returns the reply without ``ok``.

        Raises :class:`NodeOpError` if the node refused, :class:`NodeDied` if it is gone.
        """
        node = self._nodes.get(agent)
        if node is None:
            raise ValueError(f"agent: {agent!r} not one of {', '.join(self._nodes)}")
        if node.client is None or node.returncode is not None:
            raise await self._died(node, "control connection is not open")
        deadline = op_deadline_s(self.rpc_timeout_s) if op in LOCAL_OPS else math.inf
        try:
            with trio.fail_after(deadline):
                reply = await node.client.request(op, **args)
        except trio.TooSlowError:
            node.unresponsive = True
            raise NodeUnresponsive(agent, f"did not answer {op} within {deadline:g} s") \
                from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                RemoteProtocolError) as exc:
            raise await self._died(node, f"{op}: {exc!r}") from None
        if not reply.get("ok"):
            raise NodeOpError(agent, op, str(reply.get("error")))
        reply.pop("ok")
        return reply

    async def reset_all(self, *, policy: str | None = None,
                        connection: Connection | None = None,
                        owners: Mapping[str, str] | None = None,
                        episode: str | None = None) -> None:
        """New episode at every node: fresh stores, zeroed counters, new policy objects,
        and new keys bound to ``episode`` (default: a counter), re-pinned everywhere.

        ``owners`` (a new keyspace) re-sends the roster first; ports stay the same.
        """
        if connection is not None and connection not in CONNECTIONS:
            raise ValueError(f"connection: {connection!r} not one of {', '.join(CONNECTIONS)}")
        if owners is not None and dict(owners) != self.owners:
            self.owners = dict(owners)
            self.roster = self._build_roster()
            await self._configure_all()
        self.policy = policy or self.policy
        self.connection = connection or self.connection
        self.episodes_started += 1
        self.episode = f"{self.episodes_started}/{episode or 'episode'}"
        self.roster = self._build_roster()
        wire_roster = self.roster.to_wire()
        await self._each(lambda n: self.call(
            n.agent, "reset", store_path=str(n.store_path), policy=self.policy,
            connection=self.connection, identity_seed=self.identity(n.agent).seed,
            roster=wire_roster))

    async def unresponsive(self, *, timeout_s: float) -> NodeUnresponsive | None:
        """Ping every node at once on its heartbeat connection; the first that does not
        answer within ``timeout_s`` (a node that died is NodeDied's business)."""
        found: list[NodeUnresponsive] = []

        async def one(node: _Node) -> None:
            if node.heartbeat is None or node.returncode is not None:
                return
            with trio.move_on_after(timeout_s) as scope:
                try:
                    await node.heartbeat.request("ping")
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                        RemoteProtocolError):
                    return
            if scope.cancelled_caught:
                if node.process is not None and node.process.poll() is not None:
                    return  # it died meanwhile: NodeDied's business, not a frozen node
                node.unresponsive = True
                found.append(NodeUnresponsive(
                    node.agent, f"did not answer a ping within {timeout_s:g} s"))

        await self._each(one)
        return found[0] if found else None

    async def watch_liveness(self, *, timeout_s: float) -> None:
        """Watch every node on its heartbeat connection until cancelled; raise
        NodeUnresponsive for the first that is frozen (testbed/run/liveness.py: any
        freeze longer than ``timeout_s`` is caught)."""
        agent, overdue = await watch_all(
            [Watched(n.agent, n.heartbeat, partial(_exited, n)) for n in self._nodes.values()
             if n.heartbeat is not None and n.returncode is None], timeout_s=timeout_s)
        self._nodes[agent].unresponsive = True
        raise NodeUnresponsive(agent, overdue.describe())

    async def each_call(self, op: str, **args: Any) -> list[dict[str, Any]]:
        """Run one control op at every member at once; replies in ``members`` order."""
        return await self._each(lambda n: self.call(n.agent, op, **args))

    async def counters(self) -> dict[str, dict[str, int]]:
        replies = await self._each(lambda n: self.call(n.agent, "counters"))
        return dict(zip(self._nodes, replies, strict=True))

    # --- internals -----------------------------------------------------------------------
    async def _each(self, fn: Callable[[_Node], Awaitable[T]]) -> list[T]:
        """Run ``fn`` for every node at once; re-raise the first failure plainly."""
        nodes_ = list(self._nodes.values())
        results: list[Any] = [None] * len(nodes_)
        errors: list[BaseException] = []

        async def one(i: int, node: _Node) -> None:
            try:
                results[i] = await fn(node)
            except Exception as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for i, node in enumerate(nodes_):
                nursery.start_soon(one, i, node)
        if errors:
            raise errors[0]
        return results

    async def _died(self, node: _Node, detail: str) -> NodeDied:
        if node.process is not None and node.returncode is None:
            with trio.move_on_after(2.0):
                await node.process.wait()
            node.returncode = node.process.returncode
        tail = self.log_tail(node.agent).rstrip()
        code = "still running" if node.returncode is None else f"exit code {node.returncode}"
        return NodeDied(f"node {node.agent} failed ({code}; {detail}); last log lines "
                        f"from {node.log_path}:\n{tail}")

    def _build_roster(self) -> Roster:
        members = [Member(a, self.identity(a).public_key, n.bind_host, n.port)
                   for a, n in self._nodes.items()]
        members += [Member(p, self.identity(p).public_key, "", 0) for p in self.probes]
        return Roster.build(members, self.owners, self.agents)

    def _configure_args(self, node: _Node) -> dict[str, Any]:
        return {"agent_id": node.agent, "identity_seed": self.identity(node.agent).seed,
                "roster": self.roster.to_wire(), "connection": self.connection,
                "policy": self.policy, "rpc_timeout_s": self.rpc_timeout_s,
                "durability": self.durability, "store_path": str(node.store_path),
                "limits": dict(self.limits), "wire_encoding": self.wire_encoding,
                **({"congestion_control": self.congestion_control}
                   if self.congestion_control else {})}

    async def _configure_all(self) -> None:
        async def one(node: _Node) -> None:
            reply = await self.call(node.agent, "configure", **self._configure_args(node))
            node.port = int(reply["port"])

        await self._each(one)

    async def _supervise(self, node: _Node, env: dict[str, str], *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                         ) -> None:
        spawner = self._spawner  # a forked node's parent is the zygote (node_spawner.py)
        args = ["--control", node.control_path, "--log-level", "info",
                "--parent-pid", str(os.getpid() if spawner is None else spawner.pid)]
        for module in self.plugins:
            args += ["--plugin", module]
        if node.netns is not None:
            args += ["--netns", node.netns]
        try:
            async with trio.open_nursery() as inner:
                node.process = await inner.start(partial(
                    spawning.run_node, spawner, args, node.log_path, env,
                    grace_s=SHUTDOWN_GRACE_S))
                if self.ledger is not None:  # so that `clean` stops it if we are killed
                    self.ledger.record_process(node.process.pid)
                task_status.started()
        finally:
            if self.ledger is not None and node.process is not None:
                self.ledger.forget_process(node.process.pid)
        node.returncode = node.process.returncode
        if not self._closing and not node.unresponsive:
            log.error("node %s exited unexpectedly with code %s", node.agent, node.returncode)

    async def _wait_ready(self, node: _Node) -> None:
        pid = node.process.pid if node.process is not None else -1
        clock = StartupClock(self.startup_timeout_s, partial(cpu_seconds, pid))
        while not clock.expired():  # past the limit only while starved (startup rule 4)
            if node.returncode is not None or (
                    node.process is not None and node.process.returncode is not None):
                raise await self._died(node, "exited during startup")
            try:
                node.client = await ControlClient.connect(node.control_path)
                node.heartbeat = await ControlClient.connect(node.control_path)
            except OSError:
                await trio.sleep(0.02)
                continue
            await self.call(node.agent, "ping")
            return
        raise await self._died(node, "no control socket within the startup limit of "
                                     f"{self.startup_timeout_s:.1f} s (waited "
                                     f"{clock.waited_s():.1f} s, {clock.describe_cpu()})")

    async def _shutdown(self) -> None:
        self._closing = True

        async def one(node: _Node) -> None:
            if node.heartbeat is not None:
                await node.heartbeat.aclose()
                node.heartbeat = None
            if node.unresponsive and node.process is not None \
                    and node.process.returncode is None:
                node.process.kill()  # frozen: it would not obey a shutdown or SIGTERM
            if node.client is None:
                return
            with trio.move_on_after(2.0), contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                    RemoteProtocolError):
                await node.client.request("shutdown")
            await node.client.aclose()
            node.client = None
            if node.process is not None:
                with trio.move_on_after(SHUTDOWN_GRACE_S):
                    await node.process.wait()

        with trio.CancelScope(shield=True):
            await self._each(one)


@asynccontextmanager
async def open_team(*, agents: Sequence[str], central: bool,
                    hosts: Mapping[str, tuple[str | None, str]], workdir: Path,
                    campaign_seed: int | str, connection: Connection, policy: str,
                    durability: str = "full", rpc_timeout_s: float = 10.0,
                    owners: Mapping[str, str] | None = None,
                    probes: Sequence[str] = (), plugins: Sequence[str] = (),
                    congestion_control: str | None = None, limits: Mapping[str, Any] | None = None,
                    ledger: Ledger | None = None,
                    startup_timeout_s: float | None = None,
                    wire_encoding: str = "msgpack") -> AsyncIterator[Team]:
    """Start and configure a team of node processes; stop them all on exit.

    ``hosts[agent] = (netns or None, bind address)``, also for ``central`` if used.
    ``owners`` maps shared keys to agents (default: 8 keys round-robin).
    ``probes`` are extra roster members with no process (a test or benchmark acting
    as a client with ``team.identity(probe)``). ``plugins`` are modules each node
    imports at start (``python -m nodes --plugin``), e.g. to register a test policy.
    ``limits`` overrides settings of ``nodes.limits.Limits`` at every node. With a
    ``ledger`` the control sockets' directory is recorded in it before it is made.
    ``startup_timeout_s``: how long a node may take to open its control socket (default:
    measured on this host, ``testbed.run.startup``).
    """
    if connection not in CONNECTIONS:
        raise ValueError(f"connection: {connection!r} not one of {', '.join(CONNECTIONS)}")
    if durability not in DURABILITIES:
        raise ValueError(f"durability: {durability!r} not one of {', '.join(DURABILITIES)}")
    if not agents or len(set(agents)) != len(agents) or CENTRAL_ID in agents:
        raise ValueError(f"agents: need distinct names other than {CENTRAL_ID!r}")
    members = [*agents, CENTRAL_ID] if central else list(agents)
    for name in members:
        if name not in hosts:
            raise ValueError(f"hosts: no entry for {name!r}")
    team = Team(list(agents), central, campaign_seed, connection, policy, durability,
                float(rpc_timeout_s), dict(owners or key_owners(agents, 8)), tuple(probes),
                tuple(plugins), congestion_control, dict(limits or {}), ledger, wire_encoding)
    workdir = Path(workdir)
    _make_dirs(workdir / "logs", workdir / "stores")
    # Short: Unix socket paths are < 108 bytes.
    sock_dir = str(ledger.new_tmpdir("pft-ctl")) if ledger is not None \
        else tempfile.mkdtemp(prefix="pft-ctl-")
    env = spawning.node_environment()
    team.startup_timeout_s = startup_timeout_s if startup_timeout_s is not None else \
        startup_timeout(await measure_start_s(env), len(members), usable_cpus())
    for name in members:
        netns, host = hosts[name]
        team._nodes[name] = _Node(name, netns, host, os.path.join(sock_dir, f"{name}.sock"),
                                  workdir / "logs" / f"{name}.log",
                                  workdir / "stores" / f"{name}.sqlite")
    try:
        shared = spawning.shared_spawner(env)
        async with (contextlib.nullcontext(shared) if shared is not None else
                    spawning.open_spawner(env, workdir / "logs" / "zygote.log", ledger=ledger)
                    ) as team._spawner, trio.open_nursery() as nursery:
            try:
                # all at once: a shared zygote pipelines the requests (node_spawner rule 2)
                await team._each(lambda node: nursery.start(team._supervise, node, env))
                await team._each(team._wait_ready)
                team.roster = team._build_roster()
                await team._configure_all()  # bind: learn every data-plane port
                team.roster = team._build_roster()
                await team._configure_all()  # the complete roster
                yield team
            finally:
                await team._shutdown()
                nursery.cancel_scope.cancel()  # terminate/kill whatever did not exit
    finally:
        if ledger is not None:
            ledger.remove_tmpdir(Path(sock_dir))
        else:
            shutil.rmtree(sock_dir, ignore_errors=True)
