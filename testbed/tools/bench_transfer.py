"""``testbed bench transfer``: the blocking time of one fresh authenticated transfer
(paper figure C.1), on the networks of ``testbed/tools/networks/transfer.toml``.

Two node processes (``a0``, ``a1``) in their namespaces behind the network's access
links; ``a1`` owns one key. For every sample ``a1`` writes a new version of the key of
the chosen size and ``a0`` reads it (the ``read`` control op: a head query, then a
``fetch`` of the new record over a new TCP connection with the channel handshake).
The sample is the fetch round as the node's round meter times it (``fetch_ms``: TCP
connect, channel handshake, request, the record's bytes, verification), so it is one
fresh authenticated transfer, measured inside the node on CLOCK_MONOTONIC.

(a) transfer time against payload size on every network; (b) a 4 KiB transfer under
packet loss on every network: median and 95th percentile. On the LTE trace the samples
follow each other through the trace (no restart), so they see its different phases.
Writes ``transfer.json`` and ``fig_c1.png`` / ``fig_c1.svg`` into the output directory.

The reference line: the paper draws 10% of the median duration of a model role call,
the share of a call that one blocking transfer may cost before coordination rivals
generation. The line is drawn when the run is given a role-call duration
(:func:`role_call_reference`): a configured median (``--role-call-ms``; the paper's
calibration had 1170 ms) or a live run's measured one (``--role-calls RUN``: the median
over its tasks of each task's median role call); without one the figure has no line.
``--redraw`` draws the figure again from an existing ``transfer.json`` with another line.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from rich.console import Console

from testbed.errors import UserError
from testbed.links.profiles import NetworkProfile, get_profile
from testbed.net.topology import open_topology
from testbed.results.provenance import git_revision, host_description
from testbed.run.team import open_team

SIZES_KIB = (1, 4, 16, 64, 256)
LOSSES_PCT = (0.0, 1.0, 2.0, 5.0)
LOSS_SIZE_KIB = 4
SAMPLES = 20
KEY = "k000"
AGENTS = ("a0", "a1")
RPC_TIMEOUT_S = 60.0
REFERENCE_SHARE = 0.10
"""The reference line's share of the median role-call duration (the paper's 10%)."""


def transfer_networks() -> dict[str, dict[str, Any]]:
    """The benchmark's networks, as data (``networks/transfer.toml``)."""
    text = (resources.files("testbed.tools") / "networks" / "transfer.toml").read_text()
    networks: dict[str, dict[str, Any]] = tomllib.loads(text)["networks"]
    return networks


def network_profile(spec: Mapping[str, Any], *, loss_pct: float | None = None
                    ) -> NetworkProfile:
    """The profile a network definition describes (a registered base with overrides)."""
    loss = loss_pct if loss_pct is not None else spec.get("loss_pct")
    return get_profile(str(spec["base"]), rate_kbit=spec.get("rate_kbit"),
                       delay_ms=spec.get("delay_ms"), loss_pct=loss or None)


async def _samples(profile: NetworkProfile, sizes_kib: Sequence[int], samples: int,
                   workdir: Path, seed: int) -> dict[int, list[float]]:
    """Fetch times (ms) of ``samples`` fresh transfers per size on one network."""
    rng = random.Random(seed)
    out: dict[int, list[float]] = {}
    async with open_topology(profile, list(AGENTS), seed=seed) as topo:
        hosts = {name: (host.netns, host.address) for name, host in topo.hosts.items()}
        async with open_team(agents=list(AGENTS), central=False, hosts=hosts,
                             workdir=workdir, campaign_seed=seed, connection="fresh",
                             policy="local_replica", rpc_timeout_s=RPC_TIMEOUT_S,
                             owners={KEY: AGENTS[1]}) as team:
            await team.call(AGENTS[1], "seed", key=KEY, content=b"seed")
            await team.call(AGENTS[0], "read", keys=[KEY])  # a0 holds the key's history
            for size in sizes_kib:
                times = out.setdefault(size, [])
                for _ in range(samples):
                    await team.call(AGENTS[1], "update", key=KEY,
                                    content=rng.randbytes(size * 1024))
                    reply = await team.call(AGENTS[0], "read", keys=[KEY])
                    times.append(float(reply["fetch_ms"]))
    return out


def _summary(values: Sequence[float]) -> dict[str, float]:
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "mean_ms": statistics.fmean(values),
            "n": len(values)}


async def bench_transfer(console: Console, *, samples: int = SAMPLES, seed: int = 1,
                         reference: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run both panels on every network; return what ``transfer.json`` holds
    (``reference``: the line's record, :func:`role_call_reference`)."""
    networks = transfer_networks()
    result: dict[str, Any] = {"samples": samples, "sizes_kib": list(SIZES_KIB),
                              "losses_pct": list(LOSSES_PCT), "seed": seed,
                              "reference": None if reference is None else dict(reference),
                              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "git": git_revision(), "system": host_description(),
                              "networks": {}}
    with tempfile.TemporaryDirectory(prefix="tb-bench-transfer-") as tmp:
        for name, spec in networks.items():
            console.print(f"transfer: {name}: sizes {list(SIZES_KIB)} KiB")
            sizes = await _samples(network_profile(spec), SIZES_KIB, samples,
                                   Path(tmp) / name, seed)
            loss: dict[str, Any] = {}
            for pct in LOSSES_PCT:
                console.print(f"transfer: {name}: {LOSS_SIZE_KIB} KiB at {pct:g}% loss")
                got = await _samples(network_profile(spec, loss_pct=pct), (LOSS_SIZE_KIB,),
                                     samples, Path(tmp) / f"{name}-loss{pct:g}", seed)
                loss[f"{pct:g}"] = {**_summary(got[LOSS_SIZE_KIB]),
                                    "samples_ms": got[LOSS_SIZE_KIB]}
            result["networks"][name] = {
                "description": spec.get("description", ""), "definition": dict(spec),
                "sizes": {str(k): {**_summary(v), "samples_ms": v} for k, v in sizes.items()},
                "loss": loss}
    return result


def role_call_reference(*, role_call_ms: float | None = None,
                        live_run: Path | None = None) -> dict[str, Any] | None:
    """The reference line's record for ``transfer.json`` (None: no line): from a
    configured median role-call duration, or from a live run's actions."""
    if role_call_ms is not None and live_run is not None:
        raise UserError("--role-call-ms and --role-calls: give one source of the "
                        "role-call duration, not both")
    if role_call_ms is not None:
        if not role_call_ms > 0:
            raise UserError(f"--role-call-ms: {role_call_ms!r}; must be > 0")
        median, source, legend = float(role_call_ms), "configured", "configured"
    elif live_run is not None:
        median, tasks = _live_role_call_ms(live_run)
        source, legend = f"{live_run} ({tasks} tasks)", f"measured: {live_run.name}"
    else:
        return None
    return {"role_call_ms": median, "share": REFERENCE_SHARE,
            "line_ms": median * REFERENCE_SHARE, "source": source, "legend": legend}


def _live_role_call_ms(run_dir: Path) -> tuple[float, int]:
    """The median over a live run's tasks of each task's median role call, and the
    number of tasks that had one."""
    path = run_dir / "actions.parquet"
    if not path.is_file():
        raise UserError(f"--role-calls: {run_dir} has no actions.parquet (a results "
                        f"directory of a live campaign)")
    actions = pd.read_parquet(path)
    if "role_call_ms_p50" not in actions:
        raise UserError(f"--role-calls: {run_dir} is not a live run (its actions have no "
                        f"role-call durations)")
    calls = actions["role_call_ms_p50"].dropna()
    if calls.empty:
        raise UserError(f"--role-calls: {run_dir} recorded no role call")
    return float(calls.median()), len(calls)


def write_transfer(result: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write ``transfer.json`` and the figure (PNG and a byte-stable SVG)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "transfer.json", out_dir / "fig_c1.png", out_dir / "fig_c1.svg"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    figure = transfer_figure(result)
    figure.savefig(paths[1], dpi=150)
    figure.savefig(paths[2], metadata={"Date": None})
    return paths


def transfer_figure(result: Mapping[str, Any]) -> Figure:
    """Figure C.1's two panels from a ``transfer.json`` result."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    size_ax, loss_ax = figure.subplots(1, 2)
    for name, data in result["networks"].items():
        sizes = sorted(int(k) for k in data["sizes"])
        p50 = [data["sizes"][str(s)]["p50_ms"] for s in sizes]
        p95 = [data["sizes"][str(s)]["p95_ms"] for s in sizes]
        line = size_ax.plot(sizes, p50, marker="o", label=f"{name} (median)")[0]
        size_ax.fill_between(sizes, p50, p95, color=line.get_color(), alpha=0.15)
        losses = sorted(float(k) for k in data["loss"])
        loss_ax.plot(losses, [data["loss"][f"{x:g}"]["p50_ms"] for x in losses], marker="o",
                     color=line.get_color(), label=f"{name} median")
        loss_ax.plot(losses, [data["loss"][f"{x:g}"]["p95_ms"] for x in losses], marker="^",
                     linestyle="--", color=line.get_color(), label=f"{name} p95")
    reference = result.get("reference")
    for ax in (size_ax, loss_ax):
        if reference:
            ax.axhline(reference["line_ms"], color="grey", linestyle=":", linewidth=1,
                       label=f"{reference['line_ms']:.0f} ms: {reference['share']:.0%} of "
                             f"a {reference['role_call_ms']:.0f} ms role call "
                             f"({reference['legend']})")
        ax.set_ylabel("blocking time of one fresh transfer (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    size_ax.set_xscale("log", base=2)
    size_ax.set_xlabel("payload (KiB)")
    size_ax.set_title("(a) time against payload (band: median to p95)")
    loss_ax.set_xlabel("packet loss (%) on every link")
    loss_ax.set_title(f"(b) {LOSS_SIZE_KIB} KiB transfer under loss")
    size_ax.legend(fontsize=7)
    loss_ax.legend(fontsize=6, ncols=2)
    return figure
