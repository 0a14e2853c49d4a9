"""The child process of ``testbed model-server --model smollm2``: llama.cpp's
OpenAI-compatible server (llama-cpp-python's FastAPI app, under uvicorn) on one GGUF file.

Rules this module obeys:

1. It serves on the listening socket its parent passes (``--fd``), so the parent owns the
   port (and ``--port 0`` works) and a port in use is the parent's one-line error.
2. It answers ``GET /version`` with what names the model: the GGUF file's SHA-256,
   quantization and header names (``testbed.tools.gguf``), the server's version
   (``llama_cpp.__version__``), and the server-side settings (threads, context, the
   server's default seed, the chat format). A run's probe records that answer in the
   manifest (``testbed.run.model_access``).
3. It ends with its parent: its stdin is a pipe whose write end only the parent holds;
   end of file (the parent exited, however it exited) makes it stop itself (SIGTERM,
   then exit after a grace period).

Run by the parent only (``testbed.tools.llama_process``); needs the ``model`` extra.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testbed.tools.gguf import gguf_identity, read_header

EXIT_GRACE_S = 5.0
SERVER = "llama-cpp-python"


def _watch_parent() -> None:
    """Rule 3: block on stdin; at end of file stop this process."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(EXIT_GRACE_S)
    os._exit(1)


def identity(args: argparse.Namespace, version: str) -> dict[str, Any]:
    """The ``/version`` answer (rule 2)."""
    gguf = Path(args.gguf)
    template = read_header(gguf).get("tokenizer.chat_template")
    chat = args.chat_format or ("the GGUF file's chat template" if template else "llama-2")
    return {"server": SERVER, "version": version, "stand_in": False, "model": args.alias,
            "gguf": gguf_identity(gguf), "n_threads": args.threads, "n_ctx": args.ctx,
            "seed": args.seed, "chat_format": chat,
            "chat_template_sha256": _text_digest(template) if isinstance(template, str)
            else None,
            "response_format": "json_object with a schema (a grammar from the role's JSON "
                               "schema)"}


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.tools.llama_serve")
    p.add_argument("--gguf", required=True)
    p.add_argument("--alias", required=True)
    p.add_argument("--fd", type=int, required=True, help="a listening TCP socket")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat-format", default=None)
    args = p.parse_args(argv)
    threading.Thread(target=_watch_parent, name="parent-watch", daemon=True).start()

    import llama_cpp
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    answer = identity(args, str(llama_cpp.__version__))
    sock = socket.socket(fileno=args.fd)
    host, port = sock.getsockname()[:2]
    os.environ.pop("CONFIG_FILE", None)  # create_app would read another configuration
    model = ModelSettings(model=args.gguf, model_alias=args.alias, n_threads=args.threads,
                          n_threads_batch=args.threads, n_ctx=args.ctx, seed=args.seed,
                          chat_format=args.chat_format, verbose=False)
    app = create_app(server_settings=ServerSettings(host=host, port=port),
                     model_settings=[model])

    async def version() -> dict[str, Any]:
        return answer

    app.add_api_route("/version", version, methods=["GET"])
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())

