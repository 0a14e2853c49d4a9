"""etcd's v3 API over its HTTP/JSON gateway, with the standard library only.

One persistent HTTP/1.1 connection per client (``http.client``): keys and values are
base64 in the JSON, revisions are decimal strings, fields equal to their default are
left out of replies (an unsuccessful ``txn`` has no ``succeeded``).
"""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


class Etcd:
    def __init__(self, host: str, port: int = 2379, timeout_s: float = 30) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.conn.request("POST", path, json.dumps(body),
                          {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"etcd {path}: HTTP {response.status}: {data[:200]!r}")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def put(self, key: str, value: str) -> int:
        """Returns the new mod_revision of ``key``."""
        reply = self.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})
        return int(reply["header"]["revision"])

    def get(self, key: str) -> str | None:
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
        return unb64(kvs[0].get("value", "")) if kvs else None

    def revisions(self, keys: list[str]) -> dict[str, str]:
        """The mod_revision of every key, read in one transaction (one snapshot)."""
        reply = self.call("/v3/kv/txn", {"success": [
            {"request_range": {"key": b64(k)}} for k in keys]})
        return revisions_of(keys, reply)

    def put_if(self, inputs: dict[str, str], key: str, value: str) -> tuple[bool, dict[str, str]]:
        """Put ``key`` only if every input is at its mod_revision; else their revisions now."""
        keys = list(inputs)
        reply = self.call("/v3/kv/txn", {
            "compare": [{"key": b64(k), "target": "MOD", "mod_revision": v,
                         "result": "EQUAL"} for k, v in inputs.items()],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
            "failure": [{"request_range": {"key": b64(k)}} for k in keys]})
        if reply.get("succeeded"):
            return True, dict(inputs)
        return False, revisions_of(keys, reply)


def revisions_of(keys: list[str], reply: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, response in zip(keys, reply.get("responses", []), strict=True):
        kvs = response["response_range"].get("kvs", [])
        out[key] = str(kvs[0].get("mod_revision", "0")) if kvs else "0"
    return out
