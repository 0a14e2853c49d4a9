"""``testbed model-server``: the stand-in model server, a real HTTP server on a real socket.

It speaks the part of the OpenAI API the testbed's agents use, over HTTP/1.1 with
keep-alive (h11 for the protocol, trio for the sockets), and answers by the rules of
``testbed.tools.stand_in`` (not a model; docs/live.md). Routes:

- ``GET /v1/models``: the one model it serves;
- ``GET /version``: what it is (``stand_in: true``), so a run's manifest and report can
  mark results made against it;
- ``GET /health``;
- ``POST /v1/chat/completions``: non-streaming chat completions. A body that is not a
  chat request is a 400, another model's name a 404, ``stream: true`` a 400, a prompt
  without the testbed's role content a 400 (the stand-in only plays the roles).

A malformed request or a peer that goes away closes that connection only.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h11
import trio

from protocols.roles import DecisionError
from testbed.tools.stand_in import MALFORMED, StandInRules, role_prompt_digest, token_count

MAX_BODY_BYTES = 4 * 1024 * 1024
READ_BYTES = 65536
SERVER_NAME = "planfence-testbed stand-in"
DEFAULT_MODEL = "planfence-stand-in"


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False


class StandInServer:
    """The routes above over :class:`StandInRules`; counts what it served."""

    def __init__(self, rules: StandInRules, *, model: str = DEFAULT_MODEL,
                 version: str = "0") -> None:
        self.rules = rules
        self.model = model
        self.version = version
        self.attempts: dict[str, int] = defaultdict(int)
        self.requests = 0
        self.faults = 0

    async def serve(self, listener: trio.SocketListener, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY_BYTES)
        async with stream:
            try:
                while True:
                    request = await _next(conn, stream)
                    if not isinstance(request, h11.Request):
                        return
                    body = bytearray()
                    while True:
                        event = await _next(conn, stream)
                        if isinstance(event, h11.Data):
                            body += event.data
                            if len(body) > MAX_BODY_BYTES:
                                await _send(conn, stream, Reply(413, _error("body too large")))
                                return
                        elif isinstance(event, h11.EndOfMessage):
                            break
                        else:
                            return
                    reply = await self.handle(request.method.decode(),
                                              request.target.decode(), bytes(body))
                    if reply.drop:
                        return  # the dropped-connection fault: no answer at all
                    await _send(conn, stream, reply)
                    if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
            except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def handle(self, method: str, target: str, body: bytes) -> Reply:
        self.requests += 1
        path = target.split("?", 1)[0].rstrip("/")
        if method == "GET" and path in ("/v1/models", "/models"):
            return Reply(200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": SERVER_NAME}]})
        if method == "GET" and path == "/version":
            return Reply(200, {"version": self.version, "server": SERVER_NAME,
                               "stand_in": True, "latency": self.rules.latency,
                               "fault": self.rules.fault, "replay": bool(self.rules.replay),
                               "note": "rule-based stand-in, not a model"})
        if method == "GET" and path == "/health":
            return Reply(200, {"status": "ok"})
        if path in ("/v1/chat/completions", "/chat/completions"):
            if method != "POST":
                return Reply(405, _error("use POST"))
            return await self.complete(body)
        return Reply(404, _error(f"no route {method} {path}"))

    async def complete(self, body: bytes) -> Reply:
        try:
            request = json.loads(body)
            messages = request["messages"]
            if not (isinstance(messages, list) and all(
                    isinstance(m, dict) and isinstance(m.get("content"), str)
                    for m in messages)):
                raise TypeError("messages: a list of {role, content}")
        except (ValueError, KeyError, TypeError) as exc:
            return Reply(400, _error(f"not a chat completion request ({exc})"))
        if request.get("model") != self.model:
            return Reply(404, _error(f"model {str(request.get('model'))[:80]!r} is not served; "
                                     f"served: {self.model}"))
        if request.get("stream"):
            return Reply(400, _error("streaming is not supported"))
        digest = role_prompt_digest(messages)
        attempt = self.attempts[digest]
        self.attempts[digest] += 1
        fault = self.rules.fault_for(digest, attempt)
        if fault is not None:
            self.faults += 1
        await trio.sleep(self.rules.latency_s(digest, attempt))
        if fault == "slow":
            await trio.sleep(self.rules.slow_s)
        elif fault == "drop":
            return Reply(0, {}, drop=True)
        elif fault in ("429", "500"):
            status = int(fault)
            return Reply(status, _error("rate limited" if status == 429 else "injected fault"),
                         (("retry-after", "0"),) if status == 429 else ())
        try:
            text = self.rules.answer(messages, attempt)
        except DecisionError as exc:
            return Reply(400, _error(f"not a role prompt of the testbed ({exc})"))
        if text is None:
            return Reply(500, _error(f"no recorded response for prompt {digest}"))
        if fault == "malformed":
            text = MALFORMED
        return Reply(200, self.completion(messages, text, digest, attempt))

    def completion(self, messages: Sequence[Mapping[str, str]], text: str, digest: str,
                   attempt: int) -> dict[str, Any]:
        prompt_tokens = sum(token_count(str(m.get("content", ""))) for m in messages)
        completion_tokens = token_count(text)
        return {"id": f"chatcmpl-{digest[:16]}-{attempt}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model,
                "system_fingerprint": "planfence-stand-in",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens,
                          "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "stand_in_error"}}


async def _next(conn: h11.Connection, stream: trio.SocketStream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await stream.receive_some(READ_BYTES)
        conn.receive_data(data)


async def _send(conn: h11.Connection, stream: trio.SocketStream, reply: Reply) -> None:
    payload = json.dumps(reply.body).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(payload))),
               ("server", SERVER_NAME), *reply.headers]
    data = conn.send(h11.Response(status_code=reply.status, headers=headers))
    data += conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
    await stream.send_all(data)
