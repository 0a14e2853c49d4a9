"""The store's history: every committed write to etcd, as etcd's watch reports it.

Plain Python, standard library only, no testbed imports. Runs on the store's host
beside etcd (over loopback): it opens a watch on the keys of ``$TESTBED_KEYS``
(``k/<key>``), seeds every key (its first version), and records each committed put the
watch reports as a ``write`` line of ``$TESTBED_HISTORY`` (docs/history.md): version =
the key's mod_revision, owner = the writer named in the value. Once seeded it listens on
the port given (the campaign's readiness check), then records until it is stopped.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sys
import time

from etcdapi import Etcd, b64, unb64


def main() -> int:
    ready_port = int(sys.argv[1]) if len(sys.argv) > 1 else 2390
    path = os.environ.get("TESTBED_HISTORY")
    out = open(path, "w") if path else None  # noqa: SIM115 (open for the process's life)

    def emit(event: dict[str, object]) -> None:
        if out is not None:
            out.write(json.dumps(event) + "\n")
            out.flush()

    emit({"history": 1, "host": os.environ.get("TESTBED_HOST", "store")})
    keys = os.environ.get("TESTBED_KEYS", "").split()
    watch = http.client.HTTPConnection("127.0.0.1", 2379, timeout=None)
    watch.request("POST", "/v3/watch", json.dumps(
        {"create_request": {"key": b64("k/"), "range_end": b64("k0")}}))
    stream = watch.getresponse()
    created = json.loads(stream.readline())
    if not created.get("result", {}).get("created"):
        raise RuntimeError(f"etcd watch not created: {created}")
    store = Etcd("127.0.0.1")
    for key in keys:
        store.put(f"k/{key}", json.dumps({"owner": "store", "size": 0}))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seeded: set[str] = set()
    ready = None
    for line in stream:
        now = time.monotonic_ns()
        for event in json.loads(line).get("result", {}).get("events", []):
            kv = event["kv"]
            key = unb64(kv["key"]).removeprefix("k/")
            owner = json.loads(unb64(kv.get("value", ""))).get("owner", "?")
            emit({"type": "write", "t_ns": now, "key": key,
                  "version": str(kv["mod_revision"]), "owner": owner})
            seeded.add(key)
        if ready is None and seeded >= set(keys):
            ready = socket.create_server(("0.0.0.0", ready_port))  # readiness only
            print(f"recorder: {len(keys)} keys seeded", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
