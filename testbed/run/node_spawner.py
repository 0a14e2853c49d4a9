"""A team's node processes, forked by one zygote (``nodes/zygote.py``) instead of one
interpreter start each.

Rules this module obeys:

1. :func:`open_spawner` starts ``python -m nodes.zygote`` inside the caller's nursery
   (so in the team's namespaces and environment) with one end of a socket pair, and
   stops it on exit by closing that socket. The zygote's own output goes to a log file.
2. :meth:`NodeSpawner.spawn` asks for one node and returns a :class:`ForkedProcess`
   once the zygote has forked it. Requests are pipelined: each is sent whole (its send
   shielded, so a cancelled caller cannot leave half a request) and waits for its own
   reply; the zygote answers in request order, so replies are matched first in, first
   out. With 16 lanes opening 80 nodes at once, one request at a time cost a round trip
   each (a median 0.14 s wait per node on a busy host; docs/benchmarks.md). A reply
   whose caller was cancelled meanwhile is a node nobody owns: it is killed.
3. A :class:`ForkedProcess` has the parts of ``trio.Process`` a team uses (``pid``,
   ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``). Its
   exit code is the zygote's report (rule 3 there). The node is not our child, so its
   end is also watched through a pidfd: if the zygote is gone and cannot report, the
   code is :data:`UNKNOWN_EXIT` once the process has ended.
4. ``TESTBED_NODE_START=exec`` in the controller's environment starts every node as
   its own interpreter, as before the zygote (the comparison in docs/benchmarks.md).
5. :func:`one_zygote_for_all` opens one zygote for every team opened inside its scope
   (by the calling task and the tasks it starts: lanes), so 16 lanes pay for one zygote
   instead of one per team (0.25-0.35 s of CPU each; docs/benchmarks.md, "A team's
   start"). A team uses it while it runs (:func:`shared_spawner`) and opens its own
   otherwise, so a zygote that died costs no more than the teams it was serving.
   A zygote serves one trio run: a dask worker's lanes, each in a thread with a loop of
   its own, keep a zygote per team. The start probe (startup.py) runs while the scope
   opens, not when 16 teams ask for it at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from typing import Any

import trio

import nodes
from nodes.zygote import decode, encode, open_log
from testbed.host.ledger import Ledger
from testbed.run.startup import measure_start_s

log = logging.getLogger(__name__)

UNKNOWN_EXIT = 255
REPORT_GRACE_S = 2.0
ENV_NODE_START = "TESTBED_NODE_START"
NODE_STARTS = ("fork", "exec")


class SpawnError(Exception):
    """The zygote could not start a node (it is gone, or the fork failed)."""


def node_start_mode(environ: Mapping[str, str] | None = None) -> str:
    value = (os.environ if environ is None else environ).get(ENV_NODE_START, "fork")
    if value not in NODE_STARTS:
        raise ValueError(f"{ENV_NODE_START}: {value!r}; allowed: {', '.join(NODE_STARTS)}")
    return value


class ForkedProcess:
    """A node forked by the zygote (rule 3)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = trio.Event()
        self._pidfd: int | None
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # already gone and reaped: the zygote's report will say how
            self._pidfd = None

    def poll(self) -> int | None:
        return self.returncode

    def _set(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()
        self._close_pidfd()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            # watch() may be waiting on it: wake it first, or trio would keep a waiter
            # on a number the next pidfd can reuse (then BusyResourceError there)
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    async def watch(self) -> None:
        """Until the process ends: then give the zygote REPORT_GRACE_S to report its
        code, else record UNKNOWN_EXIT (rule 3)."""
        if self._pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(self._pidfd)
            except trio.ClosedResourceError:
                return  # the zygote's report came first and closed the pidfd
        with trio.move_on_after(REPORT_GRACE_S):
            await self._ended.wait()
        self._set(UNKNOWN_EXIT)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def wait_or_stop(process: ForkedProcess, grace_s: float) -> None:
    """Wait for PROCESS to end; cancelled first, SIGTERM it, then SIGKILL it after
    ``grace_s`` (what ``trio.run_process`` does to the process it started)."""
    try:
        await process.wait()
    finally:
        if process.returncode is None:
            with trio.CancelScope(shield=True):
                for stop in (process.terminate, process.kill):
                    stop()
                    with trio.move_on_after(grace_s):
                        await process.wait()
                    if process.returncode is not None:
                        break


async def run_node(spawner: NodeSpawner | None, argv: Sequence[str], log_path: Path,
                   env: Mapping[str, str], *, grace_s: float,
                   task_status: trio.TaskStatus[ForkedProcess | trio.Process]
                   = trio.TASK_STATUS_IGNORED) -> None:
    """Start ``python -m nodes ARGV`` with its output appended to LOG_PATH, forked by
    SPAWNER (None: its own interpreter, rule 4); hand over its process once started and
    return when it has ended. Cancelled, it stops the process as ``trio.run_process``
    does: SIGTERM, then SIGKILL after ``grace_s``."""
    if spawner is not None:
        process = await spawner.spawn(argv, log_path, env)
        task_status.started(process)
        await wait_or_stop(process, grace_s)
        return
    log_fd = open_log(log_path)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(await nursery.start(partial(
                trio.run_process, [sys.executable, "-m", "nodes", *argv], check=False,
                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=dict(env))))
    finally:
        os.close(log_fd)


def node_environment() -> dict[str, str]:
    """The environment of node processes: this one's, with the directory that holds the
    ``nodes`` package first on PYTHONPATH (so children import the same code)."""
    env = dict(os.environ)
    source_root = str(Path(nodes.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
    return env


class _Pending:
    """One request sent to the zygote, waiting for its reply (rule 2)."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None  # None: the zygote is gone
        self.abandoned = False  # its caller was cancelled


class NodeSpawner:
    """The controller's end of one zygote (rules 1-2)."""

    def __init__(self, stream: trio.SocketStream, nursery: trio.Nursery,
                 env: Mapping[str, str]) -> None:
        self.env = dict(env)  # the zygote's own environment (rule 5 compares it)
        self._stream = stream
        self._nursery = nursery
        self._send_lock = trio.Lock()
        self._pending: deque[_Pending] = deque()
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}  # reported before spawn() saw the pid
        self._closed = False  # the zygote's socket ended
        self.process: trio.Process | None = None

    @property
    def pid(self) -> int:
        """The zygote's process id: the parent of every node it forks."""
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return (self.process is not None and self.process.returncode is None
                and not self._closed)

    async def spawn(self, argv: Sequence[str], log_path: Path,
                    env: Mapping[str, str]) -> ForkedProcess:
        request = encode({"argv": list(argv), "log": str(log_path), "env": dict(env)})
        pending = _Pending()
        with trio.CancelScope(shield=True):  # a request is sent whole or not at all
            async with self._send_lock:
                if self._closed:
                    raise SpawnError("the node zygote is gone (its socket closed)")
                self._pending.append(pending)
                try:
                    await self._stream.send_all(request)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._pending.remove(pending)
                    raise SpawnError(f"the node zygote is gone ({exc!r})") from None
        try:
            await pending.done.wait()
        except BaseException:
            pending.abandoned = True  # read_replies kills the node it names
            raise
        reply = pending.reply
        if reply is None:
            raise SpawnError("the node zygote is gone (it ended before answering)")
        if "pid" not in reply:
            raise SpawnError(str(reply.get("error", reply)))
        return self._adopt(int(reply["pid"]))

    def _adopt(self, pid: int) -> ForkedProcess:
        child = ForkedProcess(pid)
        self._children[child.pid] = child
        if child.pid in self._early_exits:
            child._set(self._early_exits.pop(child.pid))
        else:
            self._nursery.start_soon(child.watch)
        return child

    def _answer(self, message: dict[str, Any]) -> None:
        """A fork reply: to the oldest request (rule 2); an abandoned one's node is
        killed, and its exit is still collected like any other."""
        if not self._pending:
            log.warning("the node zygote answered a request nobody sent: %r", message)
            return
        pending = self._pending.popleft()
        pending.reply = message
        pending.done.set()
        if pending.abandoned and "pid" in message:
            self._adopt(int(message["pid"])).kill()

    async def read_replies(self) -> None:
        """Route the zygote's lines: fork replies to spawn(), exits to their process."""
        pending = b""
        try:
            while True:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                messages, pending = decode(pending + data)
                for message in messages:
                    if "exit" in message:
                        pid, code = int(message["exit"]), int(message["code"])
                        child = self._children.pop(pid, None)
                        if child is None:
                            self._early_exits[pid] = code
                        else:
                            child._set(code)
                    else:
                        self._answer(message)
        finally:
            self._closed = True
            while self._pending:  # no more answers: every waiting request fails
                self._pending.popleft().done.set()
            for child in self._children.values():  # no more reports: pidfds decide
                if child.returncode is None and child._pidfd is None:
                    child._set(UNKNOWN_EXIT)


@asynccontextmanager
async def open_spawner(env: Mapping[str, str], log_path: Path, *,
                       ledger: Ledger | None = None) -> AsyncIterator[NodeSpawner | None]:
    """Start a zygote in this process's namespaces with ENV; stop it on exit (rule 1).
    With a ``ledger`` its pid is recorded there while it runs (``testbed clean``).
    Yields None, and starts nothing, when ENV asks for ``exec`` (rule 4)."""
    if node_start_mode(env) == "exec":
        yield None
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    log_fd = open_log(log_path)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    try:
        async with trio.open_nursery() as nursery:
            spawner = NodeSpawner(stream, nursery, env)
            try:
                spawner.process = await nursery.start(partial(
                    trio.run_process,
                    [sys.executable, "-m", "nodes.zygote", "--fd", str(theirs.fileno())],
                    check=False, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                    env=dict(env), pass_fds=(theirs.fileno(),)))
                theirs.close()
                if ledger is not None:
                    ledger.record_process(spawner.process.pid)
                nursery.start_soon(spawner.read_replies)
                yield spawner
            finally:
                await stream.aclose()  # the zygote exits (its rule 4)
                if spawner.process is not None:
                    with trio.move_on_after(5.0) as scope:
                        scope.shield = True
                        await spawner.process.wait()
                    if ledger is not None:
                        ledger.forget_process(spawner.process.pid)
                nursery.cancel_scope.cancel()
    finally:
        theirs.close()
        os.close(log_fd)


_SHARED: ContextVar[NodeSpawner | None] = ContextVar("testbed_node_zygote", default=None)


@asynccontextmanager
async def one_zygote_for_all(log_path: Path, *, ledger: Ledger | None = None
                             ) -> AsyncIterator[None]:
    """One zygote for the teams opened inside (rule 5); nothing with ``exec`` (rule 4).
    The start probe every team's startup limit needs (startup.py) runs meanwhile, so the
    teams find it measured instead of waiting for it together."""
    env = node_environment()
    async with open_spawner(env, log_path, ledger=ledger) as spawner, \
            trio.open_nursery() as nursery:
        nursery.start_soon(measure_start_s, env)
        token = _SHARED.set(spawner)
        try:
            yield
        finally:
            _SHARED.reset(token)
            nursery.cancel_scope.cancel()


def shared_spawner(env: Mapping[str, str]) -> NodeSpawner | None:
    """The zygote of the enclosing :func:`one_zygote_for_all`, if it runs and was started
    with ENV (rule 5)."""
    spawner = _SHARED.get()
    if spawner is None or not spawner.alive or spawner.env != dict(env):
        return None
    return spawner
