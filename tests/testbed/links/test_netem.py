"""netem backend: the pure schedule compiler everywhere, the kernel parts where netem exists."""

from __future__ import annotations

import math
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from testbed.host.ledger import new_prefix
from testbed.links.backend import LinkHost
from testbed.links.netem import NetemBackend, netem_available, open_netem_links, probe_qdisc
from testbed.links.netem_plan import (
    ZERO_RATE_FLOOR_KBIT,
    RateStep,
    compile_schedule,
    kernel_tbf_burst,
    plan_direction,
    tbf_params,
)
from testbed.links.profiles import LinkSpec, NetworkProfile, get_profile
from testbed.links.traces import Trace, load_named
from tests.privileges import as_nobody, require_netem


def make(stamps: list[int]) -> Trace:
    arr = np.asarray(stamps, dtype=np.int64)
    return Trace(name="mem.up", direction="up", stamps_ms=arr, period_ms=int(arr[-1]))


# --- compiler (pure) -------------------------------------------------------------------


def test_constant_12_mbit_trace() -> None:
    steps = compile_schedule(make([1]), offset_ms=0, interval_ms=10, duration_ms=50)
    assert [s.t_ms for s in steps] == [0.0, 10.0, 20.0, 30.0, 40.0]
    # the first interval misses the opportunity at 0 ms (the trace's only stamp is 1)
    assert [s.rate_kbit for s in steps] == pytest.approx([10_800, 12_000, 12_000, 12_000, 12_000])


def test_zero_capacity_intervals_are_explicit() -> None:
    # unrolled: 5, 100, 105, 200, 205, ... ; intervals of 10 ms over 200 ms
    steps = compile_schedule(make([5, 100]), offset_ms=0, interval_ms=10, duration_ms=200)
    assert len(steps) == 20
    rates = {s.t_ms: s.rate_kbit for s in steps}
    assert rates[0.0] == pytest.approx(1200.0)
    assert rates[100.0] == pytest.approx(2400.0)
    assert sum(1 for s in steps if s.rate_kbit == 0.0) == 18


def test_last_interval_uses_its_real_width() -> None:
    steps = compile_schedule(make([1]), offset_ms=0.5, interval_ms=10, duration_ms=25)
    assert [s.t_ms for s in steps] == [0.0, 10.0, 20.0]
    # opportunities at 0.5, 1.5, ...: 10 per full interval and 5 in the last 5 ms
    assert [s.rate_kbit for s in steps] == pytest.approx([12_000, 12_000, 12_000])


@pytest.mark.parametrize("name", ["ATT-LTE-driving.up", "TMobile-LTE-short.down"])
@pytest.mark.parametrize("offset_ms", [0.0, 5_000.0, 15_000.0])
def test_schedule_carries_exactly_the_trace_bytes(name: str, offset_ms: float) -> None:
    trace = load_named(name)
    duration = 30_007.0  # not a multiple of the interval
    steps = compile_schedule(trace, offset_ms=offset_ms, interval_ms=10, duration_ms=duration)
    edges = [s.t_ms for s in steps] + [duration]
    carried_bits = sum(s.rate_kbit * (b - a) for s, a, b in zip(steps, edges, edges[1:], strict=False))
    expected = trace.opportunities(0, duration, offset_ms).size * 1500 * 8
    assert carried_bits == pytest.approx(expected, rel=1e-9)


def test_one_period_averages_to_the_mean_rate() -> None:
    trace = load_named("Verizon-LTE-short.up")
    steps = compile_schedule(trace, offset_ms=0, interval_ms=20, duration_ms=trace.period_ms)
    mean = float(np.mean([s.rate_kbit for s in steps]))
    assert mean == pytest.approx(trace.mean_rate_kbit(), rel=0.001)


def test_offset_wraps_by_the_period() -> None:
    trace = load_named("ATT-LTE-driving-2016.up")
    a = compile_schedule(trace, offset_ms=7_000, interval_ms=10, duration_ms=5_000)
    b = compile_schedule(trace, offset_ms=7_000 + trace.period_ms, interval_ms=10, duration_ms=5_000)
    assert a == b
    assert all(isinstance(s, RateStep) for s in a)


def test_att_uplink_outage_compiles_to_a_long_zero_run() -> None:
    trace = load_named("ATT-LTE-driving.up")
    steps = compile_schedule(trace, offset_ms=0, interval_ms=100, duration_ms=trace.period_ms)
    longest = run = 0
    for s in steps:
        run = run + 1 if s.rate_kbit == 0 else 0
        longest = max(longest, run)
    # the 78.3 s gap covers at least 782 whole 100 ms intervals
    assert longest * 100 >= trace.longest_outage_ms() - 200


@pytest.mark.parametrize("name", ["ATT-LTE-driving-2016.down", "one"])
def test_compiling_in_pieces_equals_compiling_whole(name: str) -> None:
    trace = make([1]) if name == "one" else load_named(name)
    whole = compile_schedule(trace, offset_ms=3_000, interval_ms=10, duration_ms=250_000)
    pieces: list[RateStep] = []
    for start in range(0, 250_000, 25_000):
        pieces += compile_schedule(trace, offset_ms=3_000, interval_ms=10,
                                   duration_ms=25_000, start_ms=start)
    assert pieces == whole


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"offset_ms": 0, "interval_ms": 0, "duration_ms": 10}, "interval_ms"),
        ({"offset_ms": 0, "interval_ms": 10, "duration_ms": -1}, "duration_ms"),
        ({"offset_ms": math.nan, "interval_ms": 10, "duration_ms": 10}, "offset_ms"),
        ({"offset_ms": -5, "interval_ms": 10, "duration_ms": 10}, "offset_ms"),
        ({"offset_ms": 0, "interval_ms": 10, "duration_ms": 10, "start_ms": -1}, "start_ms"),
    ],
)
def test_compiler_rejects_bad_arguments(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        compile_schedule(make([1]), **kwargs)


# --- qdisc parameters (pure) ---------------------------------------------------------


def test_tbf_params() -> None:
    p = tbf_params(12_000, limit_bytes=1_500_000)
    # a bucket of one full frame (1514 bytes) and 1 ms of the rate (1500 bytes) as the
    # kernel keeps it (test_tbf_burst.py): a dequeue timer 1 ms late loses nothing
    assert (p["rate"], p["limit"]) == (1_500_000, 1_500_000)
    assert kernel_tbf_burst(p["rate"], p["burst"]) == 3014
    p16 = tbf_params(16_000, limit_bytes=3000)  # the byte limit never below the bucket
    assert 3514 <= kernel_tbf_burst(p16["rate"], p16["burst"]) <= p16["burst"] <= 3517
    assert p16["limit"] == p16["burst"]
    zero = tbf_params(0.0, limit_bytes=100)
    assert zero["rate"] == ZERO_RATE_FLOOR_KBIT * 1000 / 8
    assert zero["limit"] >= zero["burst"]


def test_direction_plans() -> None:
    att = get_profile("att", delay_ms=15, loss_pct=1)
    assert att.link is not None
    up = plan_direction(att.link, "up")
    # 1000 packets of 1500 bytes are 1000 frames of 1514 bytes on the veth qdisc
    assert (up.trace, up.rate_kbit, up.delay_ms, up.limit_bytes) == ("ATT-LTE-driving.up", None, 15, 1_514_000)
    assert up.netem_params() == {"delay": 15_000, "loss": 1, "limit": 100_000}
    assert plan_direction(att.link, "down").trace == "ATT-LTE-driving.down"
    fixed = get_profile("fixed", rate_kbit=12_000, queue_bytes=64_000).link
    assert fixed is not None
    plan = plan_direction(fixed, "down")
    # 64000 IP bytes (42 full packets) as frame bytes: 64000 * 1514 / 1500, rounded up
    assert (plan.trace, plan.rate_kbit, plan.limit_bytes, plan.shaped) == (None, 12_000, 64_598, True)
    delay_only = get_profile("fixed").link
    assert delay_only is not None
    assert not plan_direction(delay_only, "up").shaped
    with pytest.raises(ValueError, match=r"^direction: "):
        plan_direction(fixed, "sideways")


def test_backend_rejects_loopback_and_long_prefixes() -> None:
    with pytest.raises(ValueError, match=r"^profile: loopback"):
        NetemBackend(get_profile("loopback"), prefix="tbx")
    backend = NetemBackend(get_profile("att"), prefix="tbverylongpref")
    with pytest.raises(ValueError, match=r"^prefix: too long"):
        backend.describe([LinkHost("a0", "tbx0", "198.18.0.1")])
    ok = NetemBackend(get_profile("att"), prefix="tbab12")
    names = [(h, side, ifname) for h, side, ifname, _ in ok.describe(
        [LinkHost("a0", "tbab12a0", "198.18.0.1"), LinkHost("a1", "tbab12a1", "198.18.0.2")])]
    assert names == [("a0", "up", "tbab12u0"), ("a0", "down", "tbab12d0"),
                     ("a1", "up", "tbab12u1"), ("a1", "down", "tbab12d1")]


# --- schedule replay in trio (kernel calls replaced: this kernel has no netem) ---------


class RecordingBackend(NetemBackend):
    """Everything but the netlink calls: records when each rate change would be sent."""

    def __init__(self, profile: NetworkProfile) -> None:
        super().__init__(profile, prefix="tbrec", interval_ms=10)
        self.applied: list[tuple[float, list[tuple[int, float]]]] = []

    def _create(self, hosts: object) -> None:
        pass

    async def _apply_changes(self, changes: list[tuple[int, float]]) -> None:
        self.applied.append((trio.current_time(), changes))
        for i, rate in changes:
            self._directions[i].current_kbit = rate


def rounded(changes: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(i, round(rate, 6)) for i, rate in changes]


@pytest.fixture
def tiny_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NetworkProfile:
    (tmp_path / "t.up").write_text("5\n100\n")
    (tmp_path / "t.down").write_text("1\n")
    monkeypatch.setenv("TESTBED_TRACE_DIR", str(tmp_path))
    # the kernel's own order (netem delays, then tbf shapes): the schedule plays unshifted
    return NetworkProfile("tiny", LinkSpec(up_trace="t.up", down_trace="t.down",
                                           order="delay_then_link"))


async def test_schedule_changes_rates_on_time_and_restarts(
    tiny_traces: NetworkProfile, autojump_clock: trio.testing.MockClock
) -> None:
    backend = RecordingBackend(tiny_traces)
    backend.build([LinkHost("a0", "tbrecns", "198.18.0.1")])
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        # chunks of 30 ms: the steps must not depend on where chunks begin
        nursery.start_soon(partial(backend.run_schedule, chunk_ms=30))
        await trio.sleep(0.125)
        first = list(backend.applied)
        backend.applied.clear()
        t1 = trio.current_time()
        await backend.restart_trace()
        await trio.sleep(0.015)
        nursery.cancel_scope.cancel()
    up, down = 0, 1
    times = [round((t - t0) * 1000, 6) for t, _ in first]
    # up: 1200 kbit in [0,10), zero until 100, 2400 in [100,110), zero again at 110
    # down: 10800 kbit in [0,10) then a steady 12000 from 10 ms on
    assert times == [0.0, 10.0, 100.0, 110.0]
    assert rounded(first[0][1]) == [(up, 1200.0), (down, 10_800.0)]
    assert rounded(first[1][1]) == [(up, 0.0), (down, 12_000.0)]
    assert rounded(first[2][1]) == [(up, 2400.0)]
    assert rounded(first[3][1]) == [(up, 0.0)]
    # after restart_trace the replay starts again at offset 0
    restart_times = [round((t - t1) * 1000, 6) for t, _ in backend.applied]
    assert restart_times == [0.0, 10.0]
    assert rounded(backend.applied[0][1]) == [(up, 1200.0), (down, 10_800.0)]


async def test_link_then_delay_replays_each_schedule_its_delay_later(
    tiny_traces: NetworkProfile, autojump_clock: trio.testing.MockClock
) -> None:
    """netem delays before it shapes; a link whose order is link_then_delay (the default)
    plays its trace delay_ms later, per direction (the model checks it is the same)."""
    assert tiny_traces.link is not None
    link = tiny_traces.link.with_overrides(order="mahimahi", up_delay_ms=30.0,
                                           down_delay_ms=20.0)
    backend = RecordingBackend(NetworkProfile("tiny", link))
    backend.build([LinkHost("a0", "tbrecns", "198.18.0.1")])
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(partial(backend.run_schedule, chunk_ms=30))
        await trio.sleep(0.125)
        nursery.cancel_scope.cancel()
    up, down = 0, 1
    ups = [(round((t - t0) * 1000, 6), r) for t, changes in backend.applied
           for i, r in rounded(changes) if i == up]
    downs = [(round((t - t0) * 1000, 6), r) for t, changes in backend.applied
             for i, r in rounded(changes) if i == down]
    # up (link first, 30 ms): replay time x plays trace time x - 30, i.e. x + 70 mod 100,
    # so the stamps 100 and 105 (5 of the next period) both fall in [30, 40)
    assert ups == [(0.0, 0.0), (30.0, 2400.0), (40.0, 0.0)]
    # down (delay first, as mm-delay outside mm-link): unshifted
    assert downs[:2] == [(0.0, 10_800.0), (10.0, 12_000.0)]


# --- kernel probes ---------------------------------------------------------------------


def _leftovers(prefix: str) -> list[str]:
    from pyroute2 import netns as pr_netns

    return [n for n in pr_netns.listnetns() if n.startswith(prefix)]


@pytest.mark.privileged
def test_netem_probe_reports_errno_and_cleans_up() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a scratch namespace")
    prefix = new_prefix()  # random: never another run's
    ok, detail = netem_available(prefix=prefix)
    assert detail
    if not ok:
        assert "Errno" in detail, detail
    assert _leftovers(prefix) == []


@pytest.mark.privileged
def test_probe_accepts_a_builtin_qdisc() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a scratch namespace")
    prefix = new_prefix()
    ok, detail = probe_qdisc("pfifo", {"limit": 10}, prefix=prefix)
    if not ok and "scratch namespace" in detail:
        pytest.skip(f"cannot create a scratch namespace here: {detail}")
    assert ok, detail  # pfifo is built into every kernel with qdiscs
    assert _leftovers(prefix) == []


def _netem_probe_as_nobody() -> tuple[bool, str]:
    """netem_available() in a forked child that dropped to uid/gid 65534."""
    ok, detail = as_nobody(netem_available)
    return bool(ok), str(detail)


def test_probe_without_root_says_so() -> None:
    ok, detail = netem_available() if os.geteuid() != 0 else _netem_probe_as_nobody()
    assert not ok
    assert "needs root" in detail


@pytest.fixture
def netem_ready() -> None:
    require_netem()


def _exchange(names: list[str]) -> list[float]:
    """Five 200 B / 200 B request/responses a0 -> a1 over one TCP connection (ms each)."""
    from testbed.host.kernel import socket_in_netns

    server = socket_in_netns(names[1])
    client = socket_in_netns(names[0])
    rtts: list[float] = []
    try:
        server.bind(("198.18.0.2", 7000))
        server.listen(1)
        client.connect(("198.18.0.2", 7000))
        conn, _ = server.accept()
        with conn:
            for _ in range(5):
                t = time.monotonic()
                client.sendall(b"x" * 200)
                conn.recv(4096)
                conn.sendall(b"y" * 200)
                client.recv(4096)
                rtts.append((time.monotonic() - t) * 1000)
    finally:
        client.close()
        server.close()
    return rtts


@pytest.mark.privileged
@pytest.mark.netem
async def test_fixed_20ms_round_trip_over_netem(netem_ready: None) -> None:
    from testbed.host.kernel import create_netns, remove_netns

    prefix = new_prefix()[:7]  # + "h0": interface-name room
    names = [f"{prefix}h0", f"{prefix}h1"]
    hosts = [LinkHost("a0", names[0], "198.18.0.1"), LinkHost("a1", names[1], "198.18.0.2")]
    for name in names:
        create_netns(name)
    try:
        async with open_netem_links(get_profile("fixed"), hosts, prefix=prefix):
            rtts = await trio.to_thread.run_sync(_exchange, names)
            # physics: four 20 ms crossings; wide margin above for a loaded host
            assert min(rtts) >= 80.0
            assert float(np.median(rtts)) < 80.0 + 40.0
    finally:
        for name in names:
            remove_netns(name)
    assert _leftovers(prefix) == []
