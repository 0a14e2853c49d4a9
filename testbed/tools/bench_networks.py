"""`testbed bench link`, networks-as-data cases: each measured against its prediction.

- ``user_trace``: a user's own trace file (constant 12 Mbit/s) under a UDP stream at
  1.3x its capacity; delivered rate against the trace's rate.
- ``mixed_team``: three hosts on different links (AT&T, a wired 100 Mbit/s / 1 ms link,
  T-Mobile); request/response round trips between each pair against the link model
  replayed offline with each host's own specs (as in the main cases).
- ``loss_iid`` / ``loss_gilbert``: 20,000 numbered datagrams; loss rate against the
  configured mean, loss-run length against 1 / r (Gilbert-Elliott) or ~1 (IID).
- ``codel``: a 12 Mbit/s link with CoDel (5 ms / 100 ms) and drop-tail side by side
  under 1.1x overload for 8 s; queueing delay (the emulator's window) and drops against
  the same send times replayed offline through the model.
- ``capacity``: the forwarding-capacity sweep of the main bench, extended past 100k
  packets/s, with packet logs off and then on (what ``[options] link_log`` costs).
"""

from __future__ import annotations

import random
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.links.linkspec import GilbertLoss, LinkSpec, NetworkProfile
from testbed.links.model import DirectionSpec, cross_queues, direction_spec
from testbed.links.profiles import get_profile
from testbed.net.topology import Topology, open_topology
from testbed.tools.echo_probe import open_echo_server, timed_exchanges
from testbed.tools.udp_probe import StreamResult, udp_stream

FULL = 1500
HEADER = 52  # IPv4 + TCP + timestamps
TURNAROUND_MS = 0.05


def predict_between(client: tuple[DirectionSpec, DirectionSpec],
                    server: tuple[DirectionSpec, DirectionSpec], starts_s: Sequence[float],
                    request_bytes: int, reply_bytes: int) -> list[float]:
    """Persistent-connection exchanges through the model, each host with its own specs."""
    rng = random.Random(0)
    c_up, c_down = (s.make_queue(rng) for s in client)
    s_up, s_down = (s.make_queue(rng) for s in server)
    out = []
    for start in starts_s:
        t = start * 1000.0
        t = cross_queues([c_up, s_down], [request_bytes + HEADER], t)
        t = cross_queues([s_up, c_down], [reply_bytes + HEADER], t + TURNAROUND_MS)
        out.append(t - start * 1000.0)
    return out


async def _stream(topo: Topology, src: str, dst: str, **kwargs: Any) -> StreamResult:
    import trio

    result: StreamResult = await trio.to_thread.run_sync(
        lambda: udp_stream(topo.hosts[src], topo.hosts[dst], **kwargs))
    return result


async def user_trace_case(folder: Path) -> dict[str, float]:
    up, down = folder / "c12.up", folder / "c12.down"
    up.write_text("1\n")
    down.write_text("1\n")
    profile = NetworkProfile("user12", LinkSpec(up_trace=str(up), down_trace=str(down),
                                                delay_ms=2.0, queue_packets=4000))
    async with open_topology(profile, ["a", "b"], backend="userspace") as topo:
        await topo.restart_trace()
        got = await _stream(topo, "a", "b", count=5200, per_burst=13, interval_s=0.01,
                            ip_bytes=FULL)
        stats = await topo.link_statistics()
    rate = got.rate_kbit(FULL, skip=100)
    return {"offered_kbit": 15_600.0, "predicted_kbit": 12_000.0,
            "measured_kbit": round(rate, 1), "error_pct": round((rate / 12_000 - 1) * 100, 3),
            "delivered": float(len(got.received)), "sent": 5200.0,
            "emulator_late_p99_ms": stats["late_p99_ms"]}


async def mixed_team_case(count: int = 10) -> dict[str, dict[str, float]]:
    att, tmo = get_profile("att").link, get_profile("tmobile").link
    assert att is not None
    assert tmo is not None
    wired = LinkSpec(rate_kbit=100_000, delay_ms=1.0)
    profile = NetworkProfile("mixed", att, hosts=(("1", wired), ("2", tmo)))
    specs = {name: (direction_spec(link, "up"), direction_spec(link, "down"))
             for name, link in (("a", att), ("b", wired), ("c", tmo))}
    rows: dict[str, dict[str, float]] = {}
    async with open_topology(profile, ["a", "b", "c"], backend="userspace") as topo:
        for client, server in (("a", "b"), ("b", "a"), ("c", "b"), ("a", "c")):
            async with open_echo_server(topo.hosts[server]):
                origin = await topo.restart_trace()
                starts, ms = await timed_exchanges(topo.hosts[client], topo.hosts[server],
                                                   200, 200, count=count, fresh=False,
                                                   max_s=8.0, origin_s=origin)
            pred = predict_between(specs[client], specs[server], starts, 200, 200)
            rows[f"{client}_to_{server}"] = {
                "n": float(len(ms)), "p50_ms": round(statistics.median(ms), 3),
                "predicted_p50_ms": round(statistics.median(pred), 3),
                "base_rtt_ms": 2 * (specs[client][0].delay_ms + specs[server][0].delay_ms)}
    return rows


async def loss_cases(n: int = 20_000) -> dict[str, dict[str, float]]:
    ge = GilbertLoss(p=0.01, r=0.2)
    profile = NetworkProfile("lossy", LinkSpec(delay_ms=1.0), hosts=(
        ("0", LinkSpec(delay_ms=1.0, loss_pct=5.0)), ("1", LinkSpec(delay_ms=1.0, gilbert=ge))))
    out: dict[str, dict[str, float]] = {}
    async with open_topology(profile, ["a", "b", "c"], backend="userspace") as topo:
        for key, src, mean_pct, run in (("loss_iid", "a", 5.0, 1 / 0.95),
                                        ("loss_gilbert", "b", ge.mean_loss_pct, 1 / ge.r)):
            got = await _stream(topo, src, "c", count=n, per_burst=5,
                                port=9500 + len(out), warm_up=True)
            runs = got.loss_runs()
            out[key] = {"sent": float(n), "predicted_loss_pct": round(mean_pct, 3),
                        "measured_loss_pct": round(100 * got.link_lost / n, 3),
                        "receiver_drops": float(got.receiver_drops),
                        "predicted_mean_run": round(run, 3),
                        "measured_mean_run": round(statistics.mean(runs), 3) if runs else 0.0}
    return out


def _predict_queue(spec: DirectionSpec, send_ms: Sequence[float]) -> tuple[int, list[float]]:
    q = spec.make_queue(random.Random(0))
    for t in send_ms:
        q.advance(t)
        q.offer(None, FULL, t)
    q.advance(send_ms[-1] + 60_000)
    return q.counters.drops, list(q.sojourns_ms)


async def codel_case() -> dict[str, dict[str, float]]:
    codel = LinkSpec(rate_kbit=12_000, delay_ms=1.0, queue_kind="codel", queue_packets=10_000)
    tail = LinkSpec(rate_kbit=12_000, delay_ms=1.0, queue_packets=10_000)
    profile = NetworkProfile("aqm", LinkSpec(delay_ms=1.0), hosts=(("0", codel), ("1", tail)))
    out: dict[str, dict[str, float]] = {}
    async with open_topology(profile, ["a", "b", "c"], backend="userspace") as topo:
        for key, src, link in (("codel", "a", codel), ("droptail", "b", tail)):
            origin = await topo.restart_trace()
            await topo.clear_link_statistics()
            got = await _stream(topo, src, "c", count=8800, per_burst=11, interval_s=0.01,
                                ip_bytes=FULL, port=9510 + len(out), settle_s=1.0,
                                wait_s=20.0)
            stats = await topo.link_statistics()
            drops, sojourns = _predict_queue(direction_spec(link, "up"),
                                             [(t - origin) * 1000 for t in got.send_times])
            ordered = sorted(sojourns)
            out[key] = {"sent": 8800.0, "measured_drops": float(8800 - len(got.received)),
                        "predicted_drops": float(drops),
                        "measured_qdelay_p50_ms": round(stats["up_qdelay_p50_ms"], 3),
                        "measured_qdelay_p95_ms": round(stats["up_qdelay_p95_ms"], 3),
                        "predicted_qdelay_p50_ms": round(ordered[len(ordered) // 2], 3),
                        "predicted_qdelay_p95_ms": round(ordered[int(0.95 * len(ordered))], 3)}
    return out


Capacity = Callable[..., Awaitable[tuple[int, list[dict[str, float | None]]]]]
WIDE_SWEEP_PPS = (60_000, 80_000, 100_000, 120_000, 140_000, 160_000)


async def capacity_with_and_without_logs(folder: Path, measure: Capacity,
                                         ) -> dict[str, Any]:
    """The forwarding-capacity sweep, past the main bench's 100k, logs off then on."""
    zero = get_profile("fixed", delay_ms=0.0)
    out: dict[str, Any] = {}
    async with open_topology(zero, ["a", "b"], backend="userspace", packet_log=True) as topo:
        out["pps_logs_off"], out["sweep_logs_off"] = await measure(
            topo, rates_pps=WIDE_SWEEP_PPS)
        await topo.start_link_log(str(folder / "logs"), "bench")
        try:
            out["pps_logs_on"], out["sweep_logs_on"] = await measure(
                topo, rates_pps=WIDE_SWEEP_PPS)
        finally:
            await topo.stop_link_log()
        out["log_bytes"] = sum(p.stat().st_size for p in (folder / "logs").glob("*.log"))
    return out


async def bench_networks(console: Any, *, measure_capacity: Capacity) -> dict[str, Any]:
    """Every case of the module docstring; a line per case on CONSOLE. MEASURE_CAPACITY
    is the main bench's forwarding-capacity sweep (``bench_link.measure_capacity``)."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="planfence-bench-") as tmp:
        folder = Path(tmp)
        result["user_trace"] = await user_trace_case(folder)
        console.print(f"user trace 12 Mbit/s: {result['user_trace']['measured_kbit']:.0f} "
                      f"kbit/s ({result['user_trace']['error_pct']:+.2f} %)")
        result["mixed_team"] = await mixed_team_case()
        for pair, row in result["mixed_team"].items():
            console.print(f"mixed team {pair:10s} p50 {row['p50_ms']:8.2f} predicted "
                          f"{row['predicted_p50_ms']:8.2f}")
        result.update(await loss_cases())
        for key in ("loss_iid", "loss_gilbert"):
            row = result[key]
            console.print(f"{key:14s} loss {row['measured_loss_pct']:.2f} % (predicted "
                          f"{row['predicted_loss_pct']:.2f}), mean run "
                          f"{row['measured_mean_run']:.2f} (predicted "
                          f"{row['predicted_mean_run']:.2f})")
        result["queues"] = await codel_case()
        for key, row in result["queues"].items():
            console.print(f"{key:9s} drops {row['measured_drops']:.0f} (predicted "
                          f"{row['predicted_drops']:.0f}); qdelay p50 "
                          f"{row['measured_qdelay_p50_ms']:.1f} ms (predicted "
                          f"{row['predicted_qdelay_p50_ms']:.1f}), p95 "
                          f"{row['measured_qdelay_p95_ms']:.1f} ms (predicted "
                          f"{row['predicted_qdelay_p95_ms']:.1f})")
        result["capacity"] = await capacity_with_and_without_logs(folder, measure_capacity)
        result["emulator_pps_logging"] = result["capacity"]["pps_logs_on"]
        console.print(f"emulator capacity, wide sweep: {result['capacity']['pps_logs_off']} "
                      f"packets/s without packet logs, {result['capacity']['pps_logs_on']} "
                      "with them")
    return result
