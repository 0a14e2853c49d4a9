"""``testbed model-server``: the stand-in model server for tests, CI and demos, or a
real model on this machine.

By default it is the stand-in: rule-based, not a model (``testbed.tools.stand_in``); a
run made against it says so in its manifest and report. ``--model smollm2`` (a model
bundled by the ``model`` extra) or ``--gguf FILE`` serve a real model through llama.cpp's
OpenAI-compatible server, a child process of this one (``testbed.tools.llama_process``).
Point a live campaign at either by ``[model] base_url`` and ``model`` (docs/live.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from testbed.cli.common import version
from testbed.errors import HostError, UserError


def _rules(args: argparse.Namespace) -> Any:
    from testbed.tools.stand_in import StandInRules, load_replay

    replay = {}
    if args.replay is not None:
        from testbed.campaign.decisions import decision_files

        run = Path(args.replay)
        if not decision_files(run):
            raise UserError(f"--replay: {run} has no recorded decisions (decisions/*.jsonl "
                            "of a live run)")
        replay = load_replay(run)
    try:
        return StandInRules(seed=args.seed, latency=args.latency, fault=args.fault,
                            fault_rate=args.fault_rate, fault_first=args.fault_first,
                            slow_s=args.slow_s, auditor_repeat_rate=args.auditor_repeat_rate,
                            replay=replay)
    except ValueError as exc:
        raise UserError(f"--{str(exc).replace('_', '-')}") from None


def _recorded_model(run: Path) -> str:
    """The model name a live run's manifest records (what its campaign asked for)."""
    try:
        manifest = json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return "planfence-stand-in"
    model = manifest.get("model")
    name = model.get("model") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else "planfence-stand-in"


def cmd_model_server(args: argparse.Namespace) -> int:
    from testbed.tools.llama_process import BUNDLED

    if args.replay is not None:
        if args.gguf is not None:
            raise UserError("--gguf: a replay answers from a run's recordings, not a model "
                            "file; drop --gguf or --replay")
        if args.model is None:  # the name the recorded run asked for
            args.model = _recorded_model(Path(args.replay))
    elif args.gguf is not None or args.model in BUNDLED:
        return _serve_llama(args)
    if args.model is None:
        args.model = "planfence-stand-in"
    import trio

    from testbed.tools.model_server import StandInServer

    rules = _rules(args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise HostError(f"--port: cannot listen on {args.host}:{args.port} ({exc.strerror}); "
                        "choose another --port (0 picks a free one)") from None
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    server = StandInServer(rules, model=args.model, version=version())

    async def main() -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve, listener)
                print(f"stand-in model server (rule-based, not a model) serving "
                      f"{args.model!r} on http://{host}:{port}/v1 (latency {rules.latency}"
                      f"{f', fault {rules.fault}' if rules.fault else ''}"
                      f"{', replaying recorded decisions' if rules.replay else ''})",
                      flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)
    print(f"stand-in model server: {server.requests} requests, {server.faults} faults",
          file=sys.stderr)
    return 0


STAND_IN_ONLY = (("latency", "zero"), ("fault", None), ("fault_first", None),
                 ("auditor_repeat_rate", 0.0), ("replay", None))


def _serve_llama(args: argparse.Namespace) -> int:
    """A real model: llama.cpp's server on a GGUF file, until SIGTERM/SIGINT."""
    import trio

    from testbed.tools.llama_process import (
        bind,
        bundled_gguf,
        check_extra,
        host_threads,
        open_llama_server,
    )

    for name, default in STAND_IN_ONLY:
        if getattr(args, name) != default:
            raise UserError(f"--{name.replace('_', '-')}: only for the stand-in; a real model "
                            "(--model smollm2, --gguf) answers as it does")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads: {args.threads} is not allowed; allowed: integers >= 1")
    if args.ctx < 512:
        raise UserError(f"--ctx: {args.ctx} is not allowed; allowed: integers >= 512")
    check_extra()
    if args.gguf is not None:
        gguf = Path(args.gguf)
        if not gguf.is_file():
            raise UserError(f"--gguf: {gguf} is not a file")
    else:
        gguf = bundled_gguf(args.model)
    alias = args.model if args.model is not None else gguf.stem
    threads = args.threads or host_threads()
    sock = bind(args.host, args.port)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with open_llama_server(gguf, sock, alias=alias, threads=threads,
                                         ctx=args.ctx, seed=args.seed) as (url, found):
                ident = found.get("gguf") or {}
                print(f"llama.cpp server ({found.get('server', '?')} {found.get('version', '?')}"
                      f") serving {alias!r} on {url} ({ident.get('file', gguf.name)}, "
                      f"{ident.get('quantization', '?')}, sha256 "
                      f"{str(ident.get('sha256', '?'))[:16]}..., {threads} threads)",
                      flush=True)
                print(f"  [model] base_url = \"{url}\"  model = \"{alias}\"  (identity: "
                      f"{url.removesuffix('/v1')}/version)\n"
                      f"  testbed run live --model-url {url} --model {alias}", flush=True)
                async for _ in signals:
                    break

    trio.run(main)
    return 0


def register(sub: Any) -> None:
    from testbed.tools.llama_process import BUNDLED
    from testbed.tools.stand_in import FAULTS, LATENCIES

    p = sub.add_parser("model-server", help="an OpenAI-compatible model server for live "
                                            "campaigns: the stand-in (rule-based, not a "
                                            "model) or, with --model smollm2, a real model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8800, help="port (8800; 0 picks a free one)")
    p.add_argument("--model", default=None,
                   help="the model name it serves (default planfence-stand-in, the stand-in; "
                        "with --replay, the name the recorded run asked for); "
                        f"{', '.join(BUNDLED)}: that real model through llama.cpp's server "
                        "(needs the model extra: bash scripts/setup.sh --model)")
    p.add_argument("--gguf", metavar="FILE",
                   help="serve this GGUF model file through llama.cpp's server (under "
                        "--model's name, or the file's stem)")
    p.add_argument("--threads", type=int, default=None,
                   help="a real model's CPU threads (default: the CPUs this host gives it)")
    p.add_argument("--ctx", type=int, default=4096,
                   help="a real model's context length in tokens (4096)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the stand-in's latencies and faults, or a real model's "
                        "default sampling seed (0; a request's own seed wins)")
    p.add_argument("--latency", default="zero", metavar="|".join(LATENCIES) + "|SECONDS",
                   help="answer delay: zero, calibrated (median 1.17 s, IQR 0.69-2.90 s), "
                        "matched (0.6 s) or a fixed number of seconds (default zero)")
    p.add_argument("--fault", choices=list(FAULTS), help="inject a fault into answers")
    p.add_argument("--fault-rate", type=float, default=1.0,
                   help="share of attempts the fault hits (seeded; default 1)")
    p.add_argument("--fault-first", type=int, default=None, metavar="N",
                   help="only the first N attempts of each prompt (then answer normally)")
    p.add_argument("--slow-s", type=float, default=30.0,
                   help="extra delay of the slow fault (default 30 s)")
    p.add_argument("--auditor-repeat-rate", type=float, default=0.0,
                   help="chance that an agreeing auditor repeats the action (default 0)")
    p.add_argument("--replay", metavar="RUN",
                   help="answer from a live run's recorded decisions instead of the rules")
    p.set_defaults(func=cmd_model_server)
