"""A tiny versioned key-value service: the "own program" of docs/examples/own-program.

Plain Python, no testbed imports: it only reads its port from the command line. Requests
and replies are one JSON object per line over TCP:

    {"op": "put", "key": "k000", "size": 812}      -> {"ok": true, "version": 3}
    {"op": "get", "keys": ["k000", "k001"]}        -> {"ok": true, "versions": {...}}
    {"op": "plan", "action": "x", "versions": {}}  -> {"ok": true}   (stores a plan)
    {"op": "check", "action": "x"}                 -> {"ok": true, "current": true}

``check`` answers whether every key a stored plan read is still at the version the plan
saw: the service's one idea of a "safe" action.

Under a command workload it also writes its history (docs/history.md) to
``$TESTBED_HISTORY``: version 0 of every key of ``$TESTBED_KEYS`` at its start, then
every ``put`` at the instant it is committed (``by`` names the writer), so the testbed
can judge the clients' actions itself.
"""

from __future__ import annotations

import json
import os
import socketserver
import sys
import threading
import time
from typing import IO, Any

VERSIONS: dict[str, int] = {}
PLANS: dict[str, dict[str, int]] = {}
LOCK = threading.Lock()
HISTORY: IO[str] | None = None


def record(event: dict[str, object]) -> None:
    """One history line (under LOCK, so the file stays in time order)."""
    if HISTORY is not None:
        HISTORY.write(json.dumps({"t_ns": time.monotonic_ns(), **event}) + "\n")
        HISTORY.flush()


def answer(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    with LOCK:
        if op == "put":
            key = str(request["key"])
            VERSIONS[key] = VERSIONS.get(key, 0) + 1
            record({"type": "write", "key": key, "version": str(VERSIONS[key]),
                    "owner": str(request.get("by") or "server")})
            return {"ok": True, "version": VERSIONS[key]}
        if op == "get":
            return {"ok": True, "versions": {k: VERSIONS.get(k, 0) for k in request["keys"]}}
        if op == "plan":
            PLANS[str(request["action"])] = dict(request["versions"])
            return {"ok": True}
        if op == "check":
            plan = PLANS.get(str(request["action"]))
            if plan is None:
                return {"ok": False, "error": "no such plan"}
            return {"ok": True, "current": all(VERSIONS.get(k, 0) == v for k, v in plan.items())}
    return {"ok": False, "error": f"unknown op {op!r}"}


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            try:
                reply = answer(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": str(exc)}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 7000
    if os.environ.get("TESTBED_HISTORY"):
        HISTORY = open(os.environ["TESTBED_HISTORY"], "w")  # noqa: SIM115 (open for the process's life)
        HISTORY.write(json.dumps({"history": 1, "host": os.environ["TESTBED_HOST"]}) + "\n")
        with LOCK:
            for key in os.environ.get("TESTBED_KEYS", "").split():
                record({"type": "write", "key": key, "version": "0", "owner": "server"})
    with Server(("0.0.0.0", port), Handler) as server:
        print(f"kv: serving on port {port}", flush=True)
        server.serve_forever()
