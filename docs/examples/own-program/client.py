"""The client of the tiny key-value service: follows the testbed's seeded schedule.

Plain Python, no testbed imports. It reads what the testbed gives every program of a
command workload (docs/own-programs.md): the schedule file ($TESTBED_SCHEDULE), replay
time 0 of the traces ($TESTBED_T0_NS), its host's name ($TESTBED_HOST) and the file its
measurements go to ($TESTBED_METRICS). At each of its events' times it talks to the
service (server.py, the host named on the command line):

- update (it owns the key): put a new version;
- plan (it plans the action): read the versions of the action's keys, store the plan;
- act (it executes the action): ask the service whether the plan is still current,
  and report the action: ok = current, stall_ms = the time the check took.

Under a command workload it also writes its history to $TESTBED_HISTORY
(docs/history.md): each plan as a ``derive`` from the versions it read, each action as
a ``check`` (the request to the service) and the ``act`` it then issues, so the testbed
judges the actions from the history, not from what the client reports.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any


class Service:
    """One TCP connection, one JSON line per request and per reply."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def call(self, **request: object) -> dict[str, Any]:
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        line = self.reader.readline()
        if not line:
            raise ConnectionError("the service closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply


class History:
    """The history lines of this host (nothing without $TESTBED_HISTORY)."""

    def __init__(self, me: str) -> None:
        path = os.environ.get("TESTBED_HISTORY")
        self.file = open(path, "w") if path else None  # noqa: SIM115 (closed in close())
        self.emit({"history": 1, "host": me})

    def emit(self, event: dict[str, object]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(event) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def main() -> int:
    server, port = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7000
    me = os.environ["TESTBED_HOST"]
    t0_ns = int(os.environ["TESTBED_T0_NS"])
    with open(os.environ["TESTBED_SCHEDULE"]) as f:
        schedule = json.load(f)
    events = [schedule["events"][i] for i in schedule["by_host"].get(me, [])]
    service = Service(server, port)
    history = History(me)
    with open(os.environ["TESTBED_METRICS"], "a") as metrics:
        for event in events:
            due_ns = t0_ns + int(event["t_ms"] * 1e6)
            delay = (due_ns - time.monotonic_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
            if event["kind"] == "update":
                service.call(op="put", key=event["key"], size=event["size"], by=me)
            elif event["kind"] == "plan":
                versions = service.call(op="get", keys=event["keys"])["versions"]
                history.emit({"type": "derive", "t_ns": time.monotonic_ns(),
                              "plan": event["action"],
                              "inputs": {k: str(v) for k, v in versions.items()}})
                service.call(op="plan", action=event["action"], versions=versions)
            else:
                start = time.monotonic_ns()
                reply = service.call(op="check", action=event["action"])
                end = time.monotonic_ns()
                history.emit({"type": "check", "t_ns": end, "start_t_ns": start,
                              "action": event["action"]})
                history.emit({"type": "act", "t_ns": end, "action": event["action"],
                              "plan": event["action"]})
                line = {"event": "action", "action": event["action"],
                        "ok": bool(reply.get("current")), "stall_ms": (end - start) / 1e6,
                        "t_ns": start, "late_ms": max(0.0, (start - due_ns) / 1e6)}
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
        metrics.write(json.dumps({"event": "episode", "events": len(events)}) + "\n")
    history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
