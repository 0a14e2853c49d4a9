"""``testbed bench model --real MODEL``: what a live role call costs against a real model
on this machine.

1. The server is started as ``testbed model-server --model MODEL`` starts it
   (``testbed.tools.llama_process``: the bundled GGUF under llama.cpp's server, a child
   process on a free port, stopped by its pid when the bench ends).
2. ``calls`` role calls back to back through the node's own client path
   (``nodes.model_client`` + ``nodes.role_calls``) with the live preset's endpoint
   settings (sampling, ``max_tokens``, ``timeout_s``, retries, corrections and the
   schema-constrained ``response_format``), cycling planner, executor and auditor over
   the preset's templates, each prompt built as the live workflow builds it (the
   executor given the planner's decision, the auditor the executor's).
3. The figures are ``testbed.tools.role_call_stats`` over the calls' own records: the
   same statistics a committed live run's decisions give (``--role-calls RUN``).
4. With ``templates`` the live preset, shrunk to that many tasks per arm, also runs
   against the same server (``bench_model.preset_wall``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from nodes.model_client import Endpoint, ModelClient
from nodes.role_calls import RoleCaller
from protocols.roles import ModelFailure, build_prompt, decision_option, task_document
from testbed.campaign.live import task_content
from testbed.campaign.parse import load_campaign
from testbed.campaign.workload import round_robin_templates
from testbed.tools.role_call_stats import role_call_stats

ACTION = "act000"
SEED = 7


def preset_endpoint(base_url: str, model: str) -> Endpoint:
    """The live preset's endpoint settings, pointed at ``base_url`` serving ``model``."""
    settings = load_campaign("live").model
    assert settings is not None
    url = urlsplit(base_url)
    return Endpoint.from_args({**settings.to_data(), "base_url": base_url, "model": model,
                               "connect": ["tcp", url.hostname or "127.0.0.1",
                                           url.port or 80]})


async def real_role_calls(base_url: str, model: str, calls: int) -> dict[str, Any]:
    """Rule 2, then rule 3 over the calls' records."""
    client = ModelClient(preset_endpoint(base_url, model))
    caller = RoleCaller(client, "bench")
    templates = round_robin_templates(3)
    try:
        made = 0
        while made < calls:
            doc = task_document(task_content(SEED, templates[made // 3 % 3], 0))
            family = str(doc["family"])
            decision: dict[str, Any] | None = None
            for role in ("planner", "executor", "auditor"):
                if made >= calls:
                    break
                if role == "planner" or decision is None:
                    prompt = build_prompt("planner", family, requirement=doc, action=ACTION)
                elif role == "executor":
                    option = decision_option(decision)
                    prompt = build_prompt("executor", family, requirement=doc, action=ACTION,
                                          plan=decision,
                                          extra_options=[option] if option else [])
                else:
                    prompt = build_prompt("auditor", family, requirement=doc, action=ACTION,
                                          primary=decision)
                made += 1
                try:
                    decision, _ = await caller.decide(prompt, ACTION, [])
                except ModelFailure:
                    decision = None  # on the record (rule 3); the next task starts over
    finally:
        await client.aclose()
    return {"model": model, **role_call_stats(caller.drain())}


async def bench_real(console: Console, *, model: str, calls: int,
                     templates: int | None) -> dict[str, Any]:
    from testbed.tools.bench_model import preset_wall
    from testbed.tools.llama_process import (
        bind,
        bundled_gguf,
        check_extra,
        host_threads,
        open_llama_server,
    )

    check_extra()
    gguf = bundled_gguf(model)
    threads = host_threads()
    result: dict[str, Any] = {}
    async with open_llama_server(gguf, bind("127.0.0.1", 0), alias=model,
                                 threads=threads) as (url, found):
        ident = found.get("gguf") or {}
        result["server"] = {"server": found.get("server"), "version": found.get("version"),
                            "model": model, "gguf": ident.get("file"),
                            "quantization": ident.get("quantization"),
                            "sha256": ident.get("sha256"), "threads": threads}
        result["role_calls"] = calls_ = await real_role_calls(url, model, calls)
        console.print(f"bench model --real {model}: {calls_['calls']} role calls, p50 "
                      f"{_ms(calls_['latency_ms_p50'])}, p95 {_ms(calls_['latency_ms_p95'])}, "
                      f"{_rate(calls_['prompt_tokens_per_s'])} prompt and "
                      f"{_rate(calls_['completion_tokens_per_s'])} completion tokens/s, "
                      f"{calls_['schema_failures']} schema failures")
        if templates:
            result["live_preset"] = await preset_wall(url, templates, f"real:{model}",
                                                      console, model=model)
    return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
