"""``testbed bench model``: what the harness adds to a role call, and a live preset's
wall time per attempt.

1. Role-call overhead: the stand-in server at zero latency (a child process, real
   socket), and the node's own client path (``nodes.model_client`` + ``nodes.role_calls``:
   prompt, HTTP round trip, parse, log) called back to back; p50 and p90 per call, once
   straight to the server and once through the run's model relay (a Unix socket, as
   agents with the server ``beside`` them use it), beside the floor: the same request as
   raw bytes on one socket, and the client's CPU time per call (which the host's other
   load does not inflate the way it inflates wall time). The target is a p50 under 5 ms.
2. A live preset at the calibrated latency (median 1.17 s per answer): the ``live``
   preset shrunk to ``--templates`` tasks per arm, run for real (node processes,
   loopback), against the stand-in; wall time per attempt (episode), task duration
   and the role calls' median latency.
3. ``--real MODEL`` (``testbed.tools.bench_model_real``): the same client path against a
   real model started as ``testbed model-server --model MODEL`` starts it; ``--role-calls
   RUN`` the same statistics from a committed live run's recorded calls
   (``testbed.tools.role_call_stats``).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
import trio
from rich.console import Console

from nodes.model_client import Endpoint, ModelClient
from nodes.role_calls import RoleCaller
from protocols.roles import build_prompt, task_document
from testbed.campaign.live import task_content
from testbed.campaign.parse import load_campaign
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.run.relay import ModelRelay
from testbed.tools.stand_in_process import open_stand_in

MODEL = "planfence-stand-in"


def _quantiles(samples_ms: list[float]) -> dict[str, Any]:
    ordered = sorted(samples_ms)
    return {"calls": len(ordered), "p50_ms": statistics.median(ordered),
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
            "mean_ms": statistics.fmean(ordered)}


async def _calls(endpoint: Endpoint, calls: int) -> dict[str, Any]:
    client = ModelClient(endpoint)
    caller = RoleCaller(client, "bench")
    doc = task_document(task_content(7, "fulfillment-01", 0))
    prompt = build_prompt("planner", "fulfillment", requirement=doc, action="act000")
    samples: list[float] = []
    cpu_s = 0.0
    try:
        for i in range(calls + 10):
            started, cpu = time.perf_counter(), time.process_time()
            await caller.decide(prompt, "act000", [])
            if i >= 10:  # the first calls open the connection and warm the caches
                samples.append((time.perf_counter() - started) * 1000)
                cpu_s += time.process_time() - cpu
            caller.log.clear()
    finally:
        await client.aclose()
    # this process's CPU per call: the harness's own cost whatever else the host runs
    return {**_quantiles(samples), "cpu_ms_per_call": cpu_s * 1000 / calls}


async def _floor(host: str, port: int, path: str, calls: int) -> dict[str, Any]:
    """The same request as raw bytes on one kept-alive socket: what the server and the
    host cost without any client library (the floor under the harness's figure)."""
    doc = task_document(task_content(7, "fulfillment-01", 0))
    prompt = build_prompt("planner", "fulfillment", requirement=doc, action="act000")
    body = json.dumps({"model": MODEL, "messages": list(prompt.messages)}).encode()
    request = (f"POST {path}/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
               f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
               ).encode() + body
    samples: list[float] = []
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        for i in range(calls + 10):
            started = time.perf_counter()
            await stream.send_all(request)
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer) < _length(answer):
                answer += await stream.receive_some(65536)
            if i >= 10:
                samples.append((time.perf_counter() - started) * 1000)
    return _quantiles(samples)


def _length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(answer)


async def role_call_overhead(base_url: str, calls: int) -> dict[str, Any]:
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    floor = await _floor(host, port, url.path.rstrip("/"), calls)
    direct = await _calls(Endpoint(base_url, MODEL, ("tcp", host, port)), calls)
    relay = ModelRelay((host, port))
    with tempfile.TemporaryDirectory(prefix="tb-bench-model-") as tmp:
        path = str(Path(tmp) / "relay.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(16)
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.serve, sock, "bench")
            relayed = await _calls(Endpoint(base_url, MODEL, ("uds", path, 0)), calls)
            nursery.cancel_scope.cancel()
    return {"floor": floor, "direct": direct, "relay": relayed, "target_p50_ms": 5.0}


async def preset_wall(base_url: str, templates: int, latency: str,
                      console: Console, *, model: str | None = None) -> dict[str, Any]:
    campaign = load_campaign("live").with_templates(templates)
    assert campaign.model is not None
    campaign = dataclasses.replace(campaign, model=dataclasses.replace(
        campaign.model, base_url=base_url, model=model or campaign.model.model))
    with tempfile.TemporaryDirectory(prefix="tb-bench-live-") as tmp:
        out = Path(tmp) / "live"
        await run_campaign(campaign, out, resume=False, runner=EpisodeRunner(campaign),
                           console=console)
        episodes = pd.read_parquet(out / "episodes.parquet")
        actions = pd.read_parquet(out / "actions.parquet")
    done = episodes[~episodes["aborted"]]
    per_policy = {str(p): float(g["wall_s"].median()) for p, g in done.groupby("policy")}
    return {"preset": "live", "latency": latency, "templates": templates,
            "attempts": len(episodes), "aborted": int(episodes["aborted"].sum()),
            "wall_s_per_attempt_median": float(done["wall_s"].median()),
            "wall_s_per_attempt_by_policy": per_policy,
            "task_s_median": float(actions["task_s"].median()),
            "role_call_ms_median": float(actions["role_call_ms_p50"].median()),
            "model_failures": int(actions["model_failures"].sum())}


async def bench_model(console: Console, *, calls: int = 200, templates: int = 6,
                      latency: str = "calibrated") -> dict[str, Any]:
    result: dict[str, Any] = {}
    async with open_stand_in("--latency", "zero") as url:
        result["overhead"] = await role_call_overhead(url, calls)
    console.print(f"bench model: role-call overhead p50 "
                  f"{result['overhead']['floor']['p50_ms']:.2f} ms raw floor, "
                  f"{result['overhead']['direct']['p50_ms']:.2f} ms direct, "
                  f"{result['overhead']['relay']['p50_ms']:.2f} ms through the relay")
    async with open_stand_in("--latency", latency) as url:
        result["live_preset"] = await preset_wall(url, templates, latency, console)
    return result
