"""An OpenAI-compatible chat-completions client for a node's role calls (httpx, trio).

Rules this module obeys:

1. One ``POST {base_url}/chat/completions`` per attempt, streaming off, with the
   endpoint's sampling settings (temperature, top_p, max_tokens, seed when set) and the
   role's schema as ``response_format`` when the endpoint asks for it (``json_object``:
   ``{"type": "json_object", "schema": ...}``, which llama.cpp's servers turn into a
   grammar; ``json_schema``: the OpenAI form, as vLLM and Ollama take it); the
   API key is read from the environment variable the campaign names, never from a file
   or a message, and is sent only as a bearer token.
2. Where the connection goes is the controller's choice (``connect``): a Unix socket of
   the run's model relay (the server sits beside the agent: the call crosses no emulated
   link) or a TCP address in the central host's namespace (the call crosses the agent's
   access link). The request keeps the endpoint's own host name (``Host`` header, and TLS
   server name for https), so the relay only forwards bytes.
3. Timeouts (``timeout_s`` per attempt), 429 and 5xx answers, refused, dropped and
   broken connections are retried up to ``max_retries`` times with exponential backoff
   (``Retry-After`` honoured up to the backoff cap), and so is a 200 whose body is not
   a chat completion (never read as an empty decision); any other status, or the last
   failure, is a :class:`protocols.roles.ModelFailure`. When the last failure is the
   endpoint's (a timeout, a transport error, 429 or 5xx: no answer at all) it is the
   subclass :class:`protocols.roles.EndpointUnavailable`, naming the endpoint: the
   server is gone, which is the run's infrastructure failing, not the model.
4. At most ``concurrency`` calls of this node are in flight at once.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from protocols.roles import EndpointUnavailable, ModelFailure

BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class EndpointError(ValueError):
    """The endpoint settings a controller sent are not usable (names the field)."""


@dataclass(frozen=True)
class Endpoint:
    """A model endpoint as the node uses it (the ``configure_model`` op's arguments)."""

    base_url: str
    model: str
    connect: tuple[str, str, int]  # ("uds", path, 0) or ("tcp", host, port)
    api_key_env: str = ""
    temperature: float = 0.2
    top_p: float = 0.95
    max_tokens: int = 1024
    timeout_s: float = 60.0
    seed: int | None = None
    concurrency: int = 1
    max_retries: int = 3
    corrections: int = 1
    response_format: str = "none"

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Endpoint:
        try:
            connect = args["connect"]
            kind, where, port = str(connect[0]), str(connect[1]), int(connect[2])
            endpoint = cls(
                base_url=str(args["base_url"]).rstrip("/"), model=str(args["model"]),
                connect=(kind, where, port), api_key_env=str(args.get("api_key_env") or ""),
                temperature=float(args.get("temperature", 0.2)),
                top_p=float(args.get("top_p", 0.95)),
                max_tokens=int(args.get("max_tokens", 1024)),
                timeout_s=float(args.get("timeout_s", 60.0)),
                seed=None if args.get("seed") is None else int(args["seed"]),
                concurrency=int(args.get("concurrency", 1)),
                max_retries=int(args.get("max_retries", 3)),
                corrections=int(args.get("corrections", 1)),
                response_format=str(args.get("response_format", "none")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EndpointError(f"model: malformed endpoint settings ({exc!r})") from None
        if kind not in ("uds", "tcp"):
            raise EndpointError(f"connect: {kind!r} not one of uds, tcp")
        if urlsplit(endpoint.base_url).scheme not in ("http", "https"):
            raise EndpointError(f"base_url: {endpoint.base_url!r} is not http(s)")
        if not (endpoint.timeout_s > 0 and endpoint.concurrency >= 1
                and endpoint.max_retries >= 0 and endpoint.corrections >= 0):
            raise EndpointError("model: timeout_s > 0, concurrency >= 1, max_retries >= 0 "
                                "and corrections >= 0 are required")
        return endpoint


@dataclass
class Completion:
    """One accepted HTTP answer of the endpoint (a chat completion)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    attempts: int  # HTTP attempts it took (1 = no retry)
    latency_ms: float  # of the successful attempt


class ModelClient:
    """Chat completions over httpx (module rules); close with :meth:`aclose`."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        url = urlsplit(endpoint.base_url)
        self._path = url.path.rstrip("/") + "/chat/completions"
        self._extensions: dict[str, Any] = {}
        headers = {"Accept": "application/json"}
        key = os.environ.get(endpoint.api_key_env, "") if endpoint.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(endpoint.timeout_s)
        limits = httpx.Limits(max_connections=endpoint.concurrency,
                              max_keepalive_connections=endpoint.concurrency)
        kind, where, port = endpoint.connect
        if kind == "uds":
            transport = httpx.AsyncHTTPTransport(uds=where, retries=0, limits=limits)
            self._client = httpx.AsyncClient(base_url=f"{url.scheme}://{url.netloc}",
                                             transport=transport, headers=headers,
                                             timeout=timeout)
        else:
            headers["Host"] = url.netloc
            if url.scheme == "https":
                self._extensions["sni_hostname"] = url.hostname or ""
            transport = httpx.AsyncHTTPTransport(retries=0, limits=limits)
            self._client = httpx.AsyncClient(base_url=f"{url.scheme}://{where}:{port}",
                                             transport=transport, headers=headers,
                                             timeout=timeout)
        self._slots = trio.Semaphore(endpoint.concurrency)
        self.last_attempts = 0  # HTTP attempts the last chat made

    async def aclose(self) -> None:
        await self._client.aclose()

    def request_body(self, messages: Sequence[Mapping[str, str]],
                     schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
        e = self.endpoint
        body: dict[str, Any] = {"model": e.model, "messages": [dict(m) for m in messages],
                                "temperature": e.temperature, "top_p": e.top_p,
                                "max_tokens": e.max_tokens, "stream": False}
        if e.seed is not None:
            body["seed"] = e.seed
        if e.response_format == "json_object":  # llama.cpp's form: a grammar from the schema
            body["response_format"] = {"type": "json_object"} if schema is None else {
                "type": "json_object", "schema": dict(schema)}
        elif e.response_format == "json_schema" and schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "decision", "schema": dict(schema)}}
        return body

    async def chat(self, messages: Sequence[Mapping[str, str]],
                   schema: Mapping[str, Any] | None = None) -> Completion:
        """One completion, with retries on timeouts, 429/5xx and broken connections."""
        body = self.request_body(messages, schema)
        last = "no attempt"
        unavailable = True  # every attempt so far got no answer (rule 3)
        retry_after: float | None = None  # this call's last 429 (calls run concurrently)
        for attempt in range(self.endpoint.max_retries + 1):
            self.last_attempts = attempt + 1
            if attempt:
                await trio.sleep(backoff_s(attempt, last, retry_after))
            started = time.monotonic()
            try:
                async with self._slots:
                    response = await self._client.post(self._path, json=body,
                                                       extensions=self._extensions)
            except httpx.TimeoutException as exc:
                last = f"timeout after {self.endpoint.timeout_s:g} s ({type(exc).__name__})"
                unavailable = True
                continue
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                unavailable = True
                continue
            latency_ms = (time.monotonic() - started) * 1000
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}"
                unavailable = True
                retry_after = _retry_after_s(response)
                continue
            if response.status_code != 200:
                raise ModelFailure(f"HTTP {response.status_code}: {response.text[:200]}")
            try:
                return _completion(response, attempt + 1, latency_ms)
            except ModelFailure as exc:  # a garbled body: as a broken answer, retried
                last = str(exc)
                unavailable = False
        if unavailable:
            raise EndpointUnavailable(f"{self.endpoint.base_url} gave no answer after "
                                      f"{self.endpoint.max_retries + 1} attempts; last: {last}")
        raise ModelFailure(f"no answer after {self.endpoint.max_retries + 1} attempts; "
                           f"last: {last}")



def backoff_s(attempt: int, last: str, retry_after: float | None) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): doubling from the base up to the
    cap; after a 429, its ``Retry-After`` when longer, up to the same cap."""
    backoff: float = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    if last.startswith("HTTP 429") and retry_after is not None:
        backoff = min(BACKOFF_CAP_S, max(backoff, retry_after))
    return backoff


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def _completion(response: httpx.Response, attempts: int, latency_ms: float) -> Completion:
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise TypeError("content is not a string")
        usage = data.get("usage") or {}
        return Completion(text, int(usage.get("prompt_tokens") or 0),
                          int(usage.get("completion_tokens") or 0), str(data.get("model", "")),
                          attempts, latency_ms)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelFailure(f"HTTP 200 without a chat completion ({type(exc).__name__}: "
                           f"{exc})") from None
