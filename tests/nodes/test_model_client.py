"""The endpoint client (nodes/model_client.py) on the wire: what one chat-completions
request carries (a real HTTP server on a real socket records the bytes it receives),
which answers are retried and which fail at once, and the backoff between attempts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from nodes.model_client import BACKOFF_CAP_S, Endpoint, ModelClient, backoff_s
from protocols.roles import ModelFailure

MESSAGES = [{"role": "user", "content": "decide"}]
CHAT = {"object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def answer(status: int, body: Any, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(data)}",
            "content-type: application/json", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


@asynccontextmanager
async def server(answers: Sequence[bytes]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """An HTTP/1.1 server on 127.0.0.1 giving ``answers`` in turn (one per request) and
    recording each request's bytes; an empty answer closes the connection unanswered."""
    requests: list[bytes] = []
    queue = list(answers)

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while queue:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some()
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buffer) < length:
                    buffer += await stream.receive_some()
                requests.append(head + b"\r\n\r\n" + buffer[:length])
                buffer = buffer[length:]
                reply = queue.pop(0)
                if not reply:
                    return
                await stream.send_all(reply)

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, handle, 0,
                                                  host="127.0.0.1"))
        yield listener.socket.getsockname()[1], requests
        nursery.cancel_scope.cancel()


def client(port: int, **settings: Any) -> ModelClient:
    args = {"base_url": "http://model.example:8000/v1", "model": "qwen3",
            "connect": ["tcp", "127.0.0.1", port], "max_retries": 2, "timeout_s": 5,
            **settings}
    return ModelClient(Endpoint.from_args(args))


def body_of(request: bytes) -> dict[str, Any]:
    return dict(json.loads(request.partition(b"\r\n\r\n")[2]))


def header(request: bytes, name: str) -> str | None:
    for line in request.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.decode().partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


async def test_one_request_carries_the_endpoints_settings_and_the_key_as_a_bearer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFT_CLIENT_KEY", "sk-test-5678")
    schema = {"type": "object", "properties": {"tool": {"enum": ["confirm"]}}}
    async with server([answer(200, CHAT)]) as (port, requests):
        model = client(port, api_key_env="PFT_CLIENT_KEY", seed=11, temperature=0.4,
                       top_p=0.9, max_tokens=99, response_format="json_schema")
        try:
            done = await model.chat(MESSAGES, schema)
        finally:
            await model.aclose()
    (request,) = requests
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert header(request, "authorization") == "Bearer sk-test-5678"
    assert header(request, "host") == "model.example:8000"  # the endpoint's, not the relay's
    assert body_of(request) == {
        "model": "qwen3", "messages": MESSAGES, "temperature": 0.4, "top_p": 0.9,
        "max_tokens": 99, "stream": False, "seed": 11,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "decision", "schema": schema}}}
    assert done.text == "{}"
    assert done.prompt_tokens == 7
    assert done.completion_tokens == 3
    assert done.attempts == 1


async def test_json_object_carries_the_roles_schema_as_llama_cpp_takes_it() -> None:
    schema = {"type": "object", "properties": {"tool": {"enum": ["confirm"]}}}
    async with server([answer(200, CHAT), answer(200, CHAT)]) as (port, requests):
        model = client(port, response_format="json_object")
        try:
            await model.chat(MESSAGES, schema)
            await model.chat(MESSAGES)
        finally:
            await model.aclose()
    with_schema, without = (body_of(r)["response_format"] for r in requests)
    assert with_schema == {"type": "json_object", "schema": schema}
    assert without == {"type": "json_object"}


async def test_without_a_key_seed_or_format_none_of_them_is_sent() -> None:
    async with server([answer(200, CHAT)]) as (port, requests):
        model = client(port)
        try:
            await model.chat(MESSAGES, {"type": "object"})
        finally:
            await model.aclose()
    (request,) = requests
    assert header(request, "authorization") is None
    assert not {"seed", "response_format"} & set(body_of(request))


@pytest.mark.parametrize("first", [
    answer(500, {"error": "x"}),
    answer(503, {"error": "x"}),
    answer(429, {"error": "slow down"}, [("retry-after", "0")]),
    answer(200, {"object": "list", "data": []}),  # a 200 that is not a chat completion
    answer(200, b"<html>gateway</html>"),
    b"",  # closed without an answer
], ids=["500", "503", "429", "200-not-a-completion", "200-not-json", "dropped"])
async def test_retryable_answers_are_retried_then_the_completion_is_taken(first: bytes
                                                                          ) -> None:
    async with server([first, answer(200, CHAT)]) as (port, requests):
        model = client(port)
        try:
            done = await model.chat(MESSAGES)
        finally:
            await model.aclose()
    assert len(requests) == 2
    assert done.attempts == 2
    assert model.last_attempts == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_any_other_status_fails_at_once_without_a_retry(status: int) -> None:
    async with server([answer(status, {"error": "no"}), answer(200, CHAT)]) as (port,
                                                                                requests):
        model = client(port)
        try:
            with pytest.raises(ModelFailure, match=f"^HTTP {status}: "):
                await model.chat(MESSAGES)
        finally:
            await model.aclose()
    assert len(requests) == 1
    assert model.last_attempts == 1


async def test_the_last_failure_is_a_model_failure_after_every_retry() -> None:
    async with server([answer(502, {"error": "x"})] * 3) as (port, requests):
        model = client(port, max_retries=2)
        started = trio.current_time()
        try:
            with pytest.raises(ModelFailure, match="no answer after 3 attempts; last: HTTP 502"):
                await model.chat(MESSAGES)
        finally:
            await model.aclose()
        waited = trio.current_time() - started
    assert len(requests) == 3
    assert waited >= 0.25 + 0.5  # the backoff before the second and the third attempt


def test_the_backoff_doubles_to_its_cap_and_honours_retry_after_up_to_it() -> None:
    assert [backoff_s(n, "HTTP 500", None) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert backoff_s(12, "timeout", None) == BACKOFF_CAP_S
    assert backoff_s(1, "HTTP 429", 3.0) == 3.0
    assert backoff_s(3, "HTTP 429", 0.0) == 1.0  # never shorter than the backoff
    assert backoff_s(1, "HTTP 429", 600.0) == BACKOFF_CAP_S
    assert backoff_s(1, "HTTP 503", 3.0) == 0.25  # only a 429's Retry-After counts


@pytest.mark.slow
async def test_a_retry_after_of_a_429_is_waited_for() -> None:
    limited = answer(429, {"error": "slow down"}, [("retry-after", "1.5")])
    async with server([limited, answer(200, CHAT)]) as (port, _):
        model = client(port)
        started = trio.current_time()
        try:
            await model.chat(MESSAGES)
        finally:
            await model.aclose()
        assert trio.current_time() - started >= 1.5


@pytest.mark.parametrize(("args", "field"), [
    ({"connect": ["udp", "x", 1]}, "connect"),
    ({"base_url": "ftp://x/v1"}, "base_url"),
    ({"timeout_s": 0}, "timeout_s > 0"),
    ({"connect": "nowhere"}, "malformed endpoint settings"),
])
def test_endpoint_settings_that_are_not_usable_are_refused(args: dict[str, Any],
                                                           field: str) -> None:
    base = {"base_url": "http://m/v1", "model": "q", "connect": ["tcp", "127.0.0.1", 1]}
    with pytest.raises(ValueError, match=field):
        Endpoint.from_args({**base, **args})
