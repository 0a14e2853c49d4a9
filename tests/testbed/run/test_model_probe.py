"""The probe before any episode (testbed/run/model_access.py) against servers that are
not the stand-in: an HTTP server on a real socket answers the paths as vLLM, Ollama,
llama.cpp's server or a hosted API do, and the manifest's record, or the one-line error
naming the field, follows from what they answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from testbed.campaign.endpoint import parse_model
from testbed.errors import UserError
from testbed.run.model_access import probe_endpoint

NOT_FOUND = (404, {"error": "not found"})
MODELS = (200, {"object": "list", "data": [{"id": "qwen3:30b", "object": "model"}]})


@asynccontextmanager
async def server(routes: Mapping[str, tuple[int, Any]]
                 ) -> AsyncIterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """Answers GET requests by path (404 elsewhere); records (path, headers)."""
    seen: list[tuple[str, dict[str, str]]] = []

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some()
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines[1:])}
                seen.append((path, headers))
                status, body = routes.get(path, NOT_FOUND)
                data = json.dumps(body).encode()
                await stream.send_all(
                    f"HTTP/1.1 {status} X\r\ncontent-length: {len(data)}\r\n"
                    f"content-type: application/json\r\n\r\n".encode() + data)

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, handle, 0,
                                                  host="127.0.0.1"))
        yield f"http://127.0.0.1:{listener.socket.getsockname()[1]}", seen
        nursery.cancel_scope.cancel()


async def probe(root: str, model: str = "qwen3:30b", **fields: Any) -> dict[str, Any]:
    return await probe_endpoint(parse_model({"base_url": f"{root}/v1", "model": model,
                                             **fields}))


async def test_an_ollama_like_server_reports_its_version_at_api_version() -> None:
    routes = {"/v1/models": MODELS, "/api/version": (200, {"version": "0.9.2"})}
    async with server(routes) as (root, seen):
        record = await probe(root)
    assert record["served_models"] == ["qwen3:30b"]
    assert record["server_version"] == {"endpoint": "/api/version", "version": "0.9.2"}
    assert not record["stand_in"]
    assert [path for path, _ in seen] == ["/v1/models", "/version", "/api/version"]


async def test_a_vllm_like_server_answers_version_first() -> None:
    routes = {"/v1/models": MODELS, "/version": (200, {"version": "0.11.0"}),
              "/api/version": (200, {"version": "never asked"})}
    async with server(routes) as (root, seen):
        record = await probe(root)
    assert record["server_version"] == {"endpoint": "/version", "version": "0.11.0"}
    assert len(seen) == 2


async def test_a_llama_cpp_like_server_keeps_only_the_props_that_name_the_build() -> None:
    props = {"build_info": "b6123-abc", "model_path": "/m/qwen3.gguf", "total_slots": 1,
             "default_generation_settings": {"n_ctx": 4096}, "chat_template": "{{...}}"}
    async with server({"/v1/models": MODELS, "/props": (200, props)}) as (root, _):
        record = await probe(root)
    assert record["server_version"] == {"endpoint": "/props", "build_info": "b6123-abc",
                                        "model_path": "/m/qwen3.gguf", "total_slots": 1}


async def test_llama_cpp_python_started_by_hand_is_named_by_its_openapi_info() -> None:
    info = {"openapi": "3.1.0", "info": {"title": "\U0001f999 llama.cpp Python API",
                                         "version": "0.3.36"}, "paths": {}}
    async with server({"/v1/models": MODELS, "/openapi.json": (200, info)}) as (root, _):
        record = await probe(root)
    assert record["server_version"] == {"endpoint": "/openapi.json",
                                        "server": "llama-cpp-python", "version": "0.3.36"}
    assert record["identity"] is None  # no file digest: only testbed model-server says it


async def test_another_apps_openapi_is_not_taken_for_a_version() -> None:
    info = {"info": {"title": "Some proxy", "version": "9"}}
    async with server({"/v1/models": MODELS, "/openapi.json": (200, info)}) as (root, _):
        record = await probe(root)
    assert record["server_version"] == {}


async def test_the_record_names_the_sampling_sent_and_a_served_files_identity() -> None:
    version = {"server": "llama-cpp-python", "version": "0.3.36", "stand_in": False,
               "gguf": {"file": "m.Q4_1.gguf", "sha256": "ab" * 32, "quantization": "Q4_1"},
               "n_threads": 2, "n_ctx": 4096, "seed": 0, "chat_format": "x"}
    async with server({"/v1/models": MODELS, "/version": (200, version)}) as (root, _):
        record = await probe(root, temperature=0.5, seed=3)
    assert record["sampling"] == {"temperature": 0.5, "top_p": 0.95, "max_tokens": 1024,
                                  "seed": 3, "response_format": "json_object"}
    assert record["identity"] == {
        "file": "m.Q4_1.gguf", "sha256": "ab" * 32, "quantization": "Q4_1",
        "server": "llama-cpp-python", "server_version": "0.3.36", "n_threads": 2,
        "n_ctx": 4096, "server_seed": 0, "chat_format": "x"}
    assert not record["stand_in"]


async def test_a_server_that_lists_no_models_and_no_version_is_still_usable() -> None:
    async with server({}) as (root, _):
        record = await probe(root, model="anything")
    assert record["served_models"] is None
    assert record["server_version"] == {}
    assert not record["stand_in"]


async def test_a_model_the_server_does_not_list_names_model_model() -> None:
    async with server({"/v1/models": MODELS}) as (root, _):
        with pytest.raises(UserError, match=r"^model\.model: 'qwen3:8b' is not served by "
                                            r".*; served: qwen3:30b$"):
            await probe(root, model="qwen3:8b")


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_names_model_api_key_env_and_the_key_is_sent(
        status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFT_PROBE_KEY", "sk-probe-42")
    async with server({"/v1/models": (status, {"error": "bad key"})}) as (root, seen):
        with pytest.raises(UserError, match=rf"^model\.api_key_env: .* refused the request "
                                            rf"\(HTTP {status}\); .* PFT_PROBE_KEY$"):
            await probe(root, api_key_env="PFT_PROBE_KEY")
    assert seen[0][1]["authorization"] == "Bearer sk-probe-42"
    assert "sk-probe-42" not in json.dumps([path for path, _ in seen])
