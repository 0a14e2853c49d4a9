"""RPC benchmark on loopback with real node processes (issue 2, "Benchmark").

The benchmark process joins the roster as a probe member and calls one node process
through the real transport (same code as node-to-node calls):

- owner-head query latency, ``reuse`` (one pooled connection) and ``fresh`` (TCP
  connect + handshake per call), p50/p99;
- record install latency (one compact record per call, over a pooled connection),
  p50, with the node's store at durability ``full`` and ``normal``;
- head queries per second: many concurrent callers on one pooled connection;
- the same head query as a policy-defined method (``testbed.tools.bench_policy``, a
  plugin the node loads), alternated call by call with the built-in one on one pooled
  connection: ``policy_rpc_p50_ms`` against ``heads_alternating_p50_ms``;
- the floor: a raw TCP echo of 200 B between two plain Python processes
  (``testbed.tools.raw_echo``), measured in the same run, and the head-query p50s as
  multiples of it (``reuse_vs_raw``, ``fresh_vs_raw``). Both pairs are pinned to the
  same CPU placement (``testbed.tools.placement``): ``same_cpu`` (client and server on
  one CPU) and ``cross_cpu`` (each on its own), each placement with its own raw echo,
  head queries and ratios, so a ratio never divides one placement by another. The
  unpinned figures (``reuse_p50_ms`` ...) are where the scheduler put them.

Usage: ``testbed bench rpc [--json FILE] [--calls N]`` (or ``python -m testbed.tools.bench_rpc``); importable as
``run_bench(calls=...) -> dict`` for ``testbed bench rpc``. Not a test: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nodes.client import RpcClient, open_rpc_client
from nodes.rpc import call_heads, call_install, call_policy
from nodes.transport import Counters
from protocols.records import make_record
from testbed.run.team import Team, key_owners, open_team
from testbed.tools import bench_policy
from testbed.tools.placement import PLACEMENTS, affinity, pinned, plan
from testbed.tools.raw_echo import measure_raw_echo

PROBE = "bench"
NODE = "a0"
KEYS = ["k000"]


def _percentile(samples_ms: Sequence[float], q: float) -> float:
    ordered = sorted(samples_ms)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(n: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        await call(i)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return samples


async def _client_run(team: Team, connection: str,
                      body: Callable[[RpcClient], Awaitable[Any]]) -> Any:
    async with open_rpc_client(identity=team.identity(PROBE), roster=team.roster,
                               connection=connection,  # type: ignore[arg-type]
                               counters=Counters()) as client:
        return await body(client)


async def _bench_team(workdir: Path, durability: str, calls: int) -> dict[str, Any]:
    owners = key_owners([NODE], len(KEYS))
    async with open_team(agents=[NODE], central=False, hosts={NODE: (None, "127.0.0.1")},
                         workdir=workdir, campaign_seed=1, connection="reuse",
                         policy=bench_policy.NAME, durability=durability, owners=owners,
                         probes=[PROBE], plugins=[bench_policy.MODULE]) as team:
        await team.call(NODE, "seed", key=KEYS[0], content=b"x" * 200, rtype="requirement")
        out: dict[str, Any] = {}

        async def heads(client: RpcClient) -> list[float]:
            await _timed(50, lambda i: call_heads(client, team.roster, NODE, KEYS))  # warm up
            return await _timed(calls, lambda i: call_heads(client, team.roster, NODE, KEYS))

        async def installs(client: RpcClient) -> list[float]:
            ident = team.identity(PROBE)
            records = [make_record(ident, key=f"bench/{durability}/{i}", owner=PROBE, seq=0,
                                   parents=[], rtype="decision", content=bytes(512))
                       for i in range(calls // 4 + 20)]
            await _timed(20, lambda i: call_install(client, NODE, [records[i]]))
            return await _timed(calls // 4,
                                lambda i: call_install(client, NODE, [records[20 + i]]))

        async def alternating(client: RpcClient) -> tuple[list[float], list[float]]:
            built_in: list[float] = []
            policy: list[float] = []
            body = {"keys": KEYS}
            for i in range(calls + 50):  # the first 50 of each warm up
                for samples, call in ((built_in, lambda: call_heads(
                        client, team.roster, NODE, KEYS)), (policy, lambda: call_policy(
                        client, NODE, bench_policy.HEADS, body)))[::1 if i % 2 else -1]:
                    t0 = time.perf_counter()
                    await call()
                    if i >= 50:
                        samples.append((time.perf_counter() - t0) * 1e3)
            return built_in, policy

        async def throughput(client: RpcClient) -> float:
            total, workers = calls * 2, 16

            async def worker() -> None:
                for _ in range(total // workers):
                    await call_heads(client, team.roster, NODE, KEYS)

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(workers):
                    nursery.start_soon(worker)
            return (total // workers) * workers / (time.perf_counter() - t0)

        out["install"] = await _client_run(team, "reuse", installs)
        if durability == "full":
            out["reuse"] = await _client_run(team, "reuse", heads)
            out["fresh"] = await _client_run(team, "fresh", lambda c: _fresh(c, team, calls))
            out["heads_per_s"] = await _client_run(team, "reuse", throughput)
            out["alternating"] = await _client_run(team, "reuse", alternating)
            out["placed"] = {}
            for placement in PLACEMENTS:
                cpus = plan(placement)
                if cpus is None:
                    continue
                node_pid = team.pid(NODE)
                assert node_pid is not None
                with pinned(os.getpid(), {cpus[0]}), pinned(node_pid, {cpus[1]}):
                    placed = {"cpus": {"client": affinity(0), "server": affinity(node_pid)}}
                    placed["reuse"] = await _client_run(team, "reuse", heads)
                    placed["fresh"] = await _client_run(team, "fresh",
                                                        lambda c: _fresh(c, team, calls))
                out["placed"][placement] = placed
        return out


async def _fresh(client: RpcClient, team: Team, calls: int) -> list[float]:
    await _timed(20, lambda i: call_heads(client, team.roster, NODE, KEYS))
    return await _timed(max(calls // 4, 100),
                        lambda i: call_heads(client, team.roster, NODE, KEYS))


def _raw_placed(placement: str, calls: int) -> dict[str, Any] | None:
    """The raw echo with both processes pinned to PLACEMENT (None: not on this host)."""
    cpus = plan(placement)
    if cpus is None:
        return None
    observed: dict[str, Any] = {}
    with pinned(os.getpid(), {cpus[0]}):
        raw = measure_raw_echo(calls=calls, server_cpus={cpus[1]}, observed=observed)
        raw_fresh = measure_raw_echo(calls=max(calls // 4, 100), fresh=True,
                                     server_cpus={cpus[1]})
    return {"raw": raw, "raw_fresh": raw_fresh, "cpus": observed}


def _placement_figures(raw: dict[str, Any], rpc: dict[str, Any]) -> dict[str, Any]:
    """One placement's floor, head queries and their ratios (like with like)."""
    raw_p50 = _percentile(raw["raw"], 0.50)
    raw_fresh_p50 = _percentile(raw["raw_fresh"], 0.50)
    reuse_p50 = _percentile(rpc["reuse"], 0.50)
    fresh_p50 = _percentile(rpc["fresh"], 0.50)
    return {
        "raw_echo_p50_ms": round(raw_p50, 4),
        "raw_echo_fresh_p50_ms": round(raw_fresh_p50, 4),
        "reuse_p50_ms": round(reuse_p50, 4),
        "reuse_p99_ms": round(_percentile(rpc["reuse"], 0.99), 4),
        "fresh_p50_ms": round(fresh_p50, 4),
        "reuse_vs_raw": round(reuse_p50 / raw_p50, 2),
        "fresh_vs_raw": round(fresh_p50 / raw_p50, 2),
        "fresh_vs_raw_fresh": round(fresh_p50 / raw_fresh_p50, 2),
        "cpus": {"raw_echo": raw["cpus"], "rpc": rpc["cpus"]},
    }


async def bench_rpc(*, calls: int = 2000, workdir: Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the figures (JSON keys of issue 2 plus context)."""
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as tmp:
        base = Path(workdir or tmp)
        raw = {p: await trio.to_thread.run_sync(partial(_raw_placed, p, calls))
               for p in PLACEMENTS}
        full = await _bench_team(base / "full", "full", calls)
        normal = await _bench_team(base / "normal", "normal", calls)
    placements = {p: _placement_figures(r, full["placed"][p])
                  for p, r in raw.items() if r is not None and p in full["placed"]}
    return {
        **placements,
        "reuse_p50_ms": round(_percentile(full["reuse"], 0.50), 4),
        "reuse_p99_ms": round(_percentile(full["reuse"], 0.99), 4),
        "fresh_p50_ms": round(_percentile(full["fresh"], 0.50), 4),
        "fresh_p99_ms": round(_percentile(full["fresh"], 0.99), 4),
        "install_full_p50_ms": round(_percentile(full["install"], 0.50), 4),
        "install_normal_p50_ms": round(_percentile(normal["install"], 0.50), 4),
        "heads_per_s": round(full["heads_per_s"], 1),
        "heads_alternating_p50_ms": round(_percentile(full["alternating"][0], 0.50), 4),
        "policy_rpc_p50_ms": round(_percentile(full["alternating"][1], 0.50), 4),
        "policy_rpc_vs_heads": round(_percentile(full["alternating"][1], 0.50)
                                     / _percentile(full["alternating"][0], 0.50), 3),
        "samples": {"reuse": len(full["reuse"]), "fresh": len(full["fresh"]),
                    "install_full": len(full["install"]),
                    "install_normal": len(normal["install"])},
        "reuse_mean_ms": round(statistics.fmean(full["reuse"]), 4),
        "not_measured": [p for p in PLACEMENTS if p not in placements],
        "machine": {"python": platform.python_version(), "kernel": platform.release(),
                    "cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
    }


def run_bench(*, calls: int = 2000) -> dict[str, Any]:
    """Synchronous entry point for the CLI."""
    result: dict[str, Any] = trio.run(lambda: bench_rpc(calls=calls))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_rpc", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write figures here")
    parser.add_argument("--calls", type=int, default=2000,
                        help="sequential head queries per setting (default 2000)")
    args = parser.parse_args(argv)
    if args.calls < 100:
        parser.error("--calls: must be at least 100")
    figures = run_bench(calls=args.calls)
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
