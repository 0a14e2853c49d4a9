"""``python -m nodes.zygote --fd FD``: start a team's node processes by forking.

A node's start is an interpreter start plus its imports (trio, PyNaCl, the policies and
the installed plugins): about 0.4 s of CPU on this 2-core VM, paid by every node of
every team, 80 times when 16 lanes start their teams at once (docs/benchmarks.md). The
zygote pays it once per team: it imports what every node imports, then forks one child
per node, and a fork of the prepared interpreter costs a few milliseconds. Plugins are
not preloaded: each child loads its own (``--plugin`` in its ARGV, and the installed
entry points), so a plugin that fails fails its node as it did before.

Rules this module obeys:

1. The zygote never starts a thread or a trio loop, so that forking it is safe; it
   serves one Unix stream socket (file descriptor FD, from the controller) with one
   JSON object per line.
2. A request ``{"argv": [...], "log": PATH, "env": {...}}`` forks a child that makes
   PATH its stdout and stderr (appending), /dev/null its stdin, ENV its whole
   environment, and runs ``python -m nodes ARGV`` in-process: ``sys.argv`` and
   ``__main__`` are the node's, then ``nodes.__main__.main(ARGV)`` runs.
   The reply is ``{"pid": PID}``, or ``{"error": TEXT}`` when the fork failed.
3. The zygote reaps its children and reports each one's end as ``{"exit": PID,
   "code": CODE}``, with the convention of ``subprocess``: the exit status, or minus the
   signal that ended it.
4. When the socket closes (the team is done, or the controller is gone: the kernel
   closes it), the zygote exits and leaves its children alone. The controller names
   the zygote as each node's ``--parent-pid``, so a node whose zygote is gone stops,
   as a node started directly stops when its controller is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import Any


def encode(message: dict[str, Any]) -> bytes:
    """One message on the zygote's socket: a JSON object on a line (rule 1)."""
    return json.dumps(message).encode() + b"\n"


def decode(pending: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The complete messages at the front of PENDING, and the incomplete rest."""
    *lines, rest = pending.split(b"\n")
    return [json.loads(line) for line in lines], rest


def open_log(path: str | os.PathLike[str]) -> int:
    """A node's (or the zygote's) log file, opened for appending."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _preload() -> None:
    """Import what every node imports before it serves (``nodes.__main__``)."""
    import trio  # noqa: F401

    import nodes.control
    import nodes.node
    import nodes.plugins  # noqa: F401


def _child(request: dict[str, Any], closing: Sequence[int]) -> None:
    """The forked child: become a node (rule 2); never returns."""
    code: int = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        log_fd = open_log(str(request["log"]))
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null_fd)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        import nodes.__main__ as node_main

        argv = [str(a) for a in request["argv"]]
        # As ``python -m nodes ARGV`` would have it, for plugins that look (rule 2).
        sys.argv = [str(node_main.__file__), *argv]
        sys.modules["__main__"] = node_main
        code = node_main.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(sock: socket.socket) -> None:
    """Rules 2-4 until the socket closes."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake fd fires
    signal.set_wakeup_fd(wake_w)
    pending = b""

    def send(message: dict[str, Any]) -> None:
        sock.sendall(encode(message))

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send({"exit": pid, "code": _exit_code(status)})

    try:
        while True:
            ready = select.select([sock.fileno(), wake_r], [], [])[0]
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                reap()
            if sock.fileno() not in ready:
                continue
            data = sock.recv(65536)
            if not data:
                return  # rule 4
            requests, pending = decode(pending + data)
            for request in requests:
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    send({"error": f"fork: {exc} (errno {exc.errno})"})
                    continue
                if pid == 0:
                    _child(request, (sock.fileno(), wake_r, wake_w))
                send({"pid": pid})
                reap()
    except (BrokenPipeError, ConnectionResetError):
        return  # the controller is gone: rule 4
    finally:
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes.zygote", description=__doc__)
    parser.add_argument("--fd", type=int, required=True,
                        help="the Unix stream socket to serve (inherited from the controller)")
    args = parser.parse_args(argv)
    _preload()
    with socket.socket(fileno=args.fd) as sock:
        serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
