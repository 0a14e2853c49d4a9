"""The store's history: every committed write to Redis, as the store saw it.

Plain Python against redis-py, no testbed imports. Runs on the store's host beside
redis-server (over loopback). It seeds version 0 of every key of ``$TESTBED_KEYS``,
subscribes to the ``writes`` channel that the owners' write script publishes to inside
the same atomic script as the write (agent.py, ``WRITE``), and records each as a
``write`` line of ``$TESTBED_HISTORY`` (docs/history.md) at the instant it arrives:
microseconds after the commit, long before any agent behind its link can read it.
Once seeded and subscribed it listens on the port given (the campaign's readiness
check), then records until it is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import redis


def main() -> int:
    ready_port = int(sys.argv[1]) if len(sys.argv) > 1 else 6380
    path = os.environ.get("TESTBED_HISTORY")
    out = open(path, "w") if path else None  # noqa: SIM115 (open for the process's life)

    def emit(event: dict[str, object]) -> None:
        if out is not None:
            out.write(json.dumps(event) + "\n")
            out.flush()

    emit({"history": 1, "host": os.environ.get("TESTBED_HOST", "store")})
    store = redis.Redis(host="127.0.0.1", port=6379)
    pubsub = store.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("writes")
    for key in os.environ.get("TESTBED_KEYS", "").split():
        store.set(f"ver:{key}", 0)
        emit({"type": "write", "t_ns": time.monotonic_ns(), "key": key, "version": "0",
              "owner": "store"})
    ready = socket.create_server(("0.0.0.0", ready_port))  # noqa: F841 (readiness only)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"recorder: {len(os.environ.get('TESTBED_KEYS', '').split())} keys seeded",
          flush=True)
    for message in pubsub.listen():  # type: ignore[no-untyped-call]
        now = time.monotonic_ns()
        key, version, owner = message["data"].decode().split(" ")
        emit({"type": "write", "t_ns": now, "key": key, "version": version, "owner": owner})
    return 0


if __name__ == "__main__":
    sys.exit(main())
