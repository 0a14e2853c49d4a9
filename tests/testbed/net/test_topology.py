"""Topology: planning (pure) and real namespaces behind the userspace emulator (privileged)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from testbed.errors import UserError
from testbed.host import kernel, processes
from testbed.links.profiles import get_profile
from testbed.links.userspace import UserspaceLinks, tun_name
from testbed.net.plan import TopologyError, plan_topology
from testbed.net.topology import Network, open_topology
from testbed.tools.echo_probe import open_echo_server, timed_exchanges
from tests.leftovers import prefix_objects, watch_runs

REPO = Path(__file__).resolve().parents[3]


def _privileged() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")


# ---------------------------------------------------------------- pure


def test_plan_names_and_addresses() -> None:
    plan = plan_topology(get_profile("fixed"), ["a", "b"], central=True, prefix="tbabc123",
                         backend="userspace")
    assert [(h.name, h.netns, h.address) for h in plan.hosts] == [
        ("a", "tbabc123-a", "198.18.0.1"),
        ("b", "tbabc123-b", "198.18.0.2"),
        ("central", "tbabc123-central", "198.18.0.3"),
    ]
    assert [tun_name(plan.prefix, i) for i in range(3)] == ["tbabc123t0", "tbabc123t1",
                                                            "tbabc123t2"]


def test_loopback_plans_nothing_in_the_kernel() -> None:
    plan = plan_topology(get_profile("loopback"), ["a", "b"])
    assert plan.backend == "none"
    assert {(h.netns, h.address) for h in plan.hosts} == {(None, "127.0.0.1")}


@pytest.mark.parametrize(
    ("agents", "kwargs", "field"),
    [
        ([], {}, "agents"),
        (["a", "a"], {}, "agents"),
        (["a b"], {}, "agents"),
        (["central"], {"central": True}, "agents"),
        (["a"], {"backend": "none"}, "backend"),
        (["a"], {"backend": "tc"}, "backend"),
        (["a"], {"trace_offset_s": -1.0}, "trace_offset_s"),
        (["a"], {"prefix": "../x"}, "prefix"),
    ],
)
def test_bad_input_names_the_field(agents: list[str], kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(UserError, match=field):
        plan_topology(get_profile("fixed"), agents, **kwargs)  # type: ignore[arg-type]


async def test_loopback_topology_creates_nothing() -> None:
    with watch_runs() as runs:
        async with open_topology(get_profile("loopback"), ["a", "b"]) as topo:
            assert topo.backend == "none"
            assert topo.hosts["a"].netns is None
            assert (await topo.link_counters())["b"]["up_bytes"] == 0
            assert topo.describe()["backend"] == "none"
    assert runs.prefixes == set()  # no ledger: nothing recorded, so nothing created


# ---------------------------------------------------------------- privileged


@pytest.mark.privileged
async def test_fixed_20ms_round_trip_crosses_four_delays() -> None:
    _privileged()
    async with open_topology(get_profile("fixed", delay_ms=20.0), ["a", "b"],
                             backend="userspace") as topo:
        a, b = topo.hosts["a"], topo.hosts["b"]
        assert a.netns is not None
        assert a.netns in kernel.list_netns()
        assert kernel.get_sysctl(a.netns, "net.ipv4.tcp_congestion_control") == "cubic"
        async with open_echo_server(b):
            _, ms = await timed_exchanges(a, b, 200, 200, count=5, fresh=False)
    # physics: four 20 ms crossings; the margin only absorbs a loaded host
    assert min(ms) >= 80.0
    assert sorted(ms)[len(ms) // 2] < 80.0 + 25.0


@pytest.mark.privileged
async def test_rate_limit_delays_a_64k_reply_and_counters_match() -> None:
    _privileged()
    profile = get_profile("fixed", delay_ms=5.0, rate_kbit=2000.0)
    reply = 65536
    async with open_topology(profile, ["a", "b"], backend="userspace") as topo:
        a, b = topo.hosts["a"], topo.hosts["b"]
        async with open_echo_server(b):
            before = await topo.link_counters()
            _, ms = await timed_exchanges(a, b, 200, reply, count=1, fresh=False)
            await trio.sleep(0.1)  # let the last ACKs cross
            after = await topo.link_counters()
    serialization_ms = reply * 8 / 2000.0  # 262 ms of payload at 2 Mbit/s
    assert ms[0] >= 4 * 5.0 + serialization_ms
    assert ms[0] < 4 * 5.0 + 1.2 * serialization_ms + 8 * 20.0 + 200.0
    sent_by_b = after["b"]["up_bytes"] - before["b"]["up_bytes"]
    packets_by_b = after["b"]["up_packets"] - before["b"]["up_packets"]
    assert reply <= sent_by_b <= reply + packets_by_b * 60
    assert after["a"]["down_bytes"] - before["a"]["down_bytes"] == sent_by_b
    assert after["b"]["up_drops"] == 0


@pytest.mark.privileged
async def test_teardown_leaves_nothing_even_after_an_exception() -> None:
    _privileged()
    seen: dict[str, object] = {}

    async def body() -> None:
        async with open_topology(get_profile("fixed"), ["a", "b"], central=True,
                                 backend="userspace") as topo:
            assert isinstance(topo.links, UserspaceLinks)
            seen["prefix"] = topo.prefix
            seen["pid"] = topo.links.emulator.process.pid
            assert len(prefix_objects(topo.prefix)) == 4  # 3 namespaces + the state file
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await body()
    assert prefix_objects(str(seen["prefix"])) == []
    assert processes.process_start_ticks(int(str(seen["pid"]))) is None


@contextlib.contextmanager
def _background(script: str) -> Iterator[subprocess.Popen[str]]:
    """SCRIPT in a child that ignores SIGINT, as a background job of a non-interactive
    shell does (so only SIGTERM can stop it cleanly); killed if the test leaves it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_SIGTERM_SCRIPT = """
import sys, trio
from testbed.links.profiles import get_profile
from testbed.net.topology import open_topology

async def main():
    async with open_topology(get_profile("fixed"), ["a", "b"], backend="userspace") as topo:
        print(topo.prefix, topo.links.emulator.process.pid, flush=True)
        await trio.sleep(60)

trio.run(main)
"""


@pytest.mark.privileged
def test_sigterm_removes_everything() -> None:
    _privileged()
    with _background(_SIGTERM_SCRIPT) as proc:
        assert proc.stdout is not None
        prefix, emulator_pid = proc.stdout.readline().split()
        assert prefix_objects(prefix)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert prefix_objects(prefix) == []
    deadline = time.monotonic() + 5
    while processes.process_start_ticks(int(emulator_pid)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes.process_start_ticks(int(emulator_pid)) is None


_SIGTERM_TWO_SCRIPT = """
import sys, trio
from testbed.links.profiles import get_profile
from testbed.net.topology import open_topology

async def one(name, hold_s, started):
    async with open_topology(get_profile("fixed"), ["a", "b"], backend="userspace") as topo:
        print(name, topo.prefix, flush=True)
        started.set()
        await trio.sleep(hold_s)
    print("closed", name, flush=True)

async def main():
    async with trio.open_nursery() as nursery:
        first, second = trio.Event(), trio.Event()
        nursery.start_soon(one, "first", 0.5, first)   # opens first, closes first
        await first.wait()
        nursery.start_soon(one, "second", 60, second)

trio.run(main)
"""


@pytest.mark.privileged
def test_sigterm_removes_the_topology_that_outlived_an_earlier_one() -> None:
    """Two topologies in one process (``--jobs``), closed out of order: the SIGTERM
    handler must still serve the one left open."""
    _privileged()
    with _background(_SIGTERM_TWO_SCRIPT) as proc:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().split() for _ in range(3)]
        prefixes = {words[0]: words[1] for words in lines if words[0] != "closed"}
        assert ["closed", "first"] in lines
        assert prefix_objects(prefixes["second"])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert prefix_objects(prefixes["first"]) == []
    assert prefix_objects(prefixes["second"]) == []


@pytest.mark.privileged
async def test_trace_outage_holds_packets_and_restart_replays_it() -> None:
    _privileged()
    from testbed.links.traces import load_named

    profile = get_profile("att2016")
    assert profile.link is not None
    assert profile.link.up_trace is not None
    up = load_named(profile.link.up_trace)
    offset_ms = 20_900.0  # inside the 4 s uplink outage that starts at 20.8 s
    first_up_ms = float(up.opportunities(0.0, 10_000.0, offset_ms)[0])
    assert first_up_ms > 3000.0
    async with open_topology(profile, ["a", "b"], backend="userspace",
                             trace_offset_s=offset_ms / 1000.0) as topo:
        a, b = topo.hosts["a"], topo.hosts["b"]
        async with open_echo_server(b):
            rounds = []
            for _ in range(2):
                origin = await topo.restart_trace()
                starts, ms = await timed_exchanges(a, b, 200, 200, count=1, fresh=True,
                                                   origin_s=origin)
                rounds.append(starts[0] * 1000.0 + ms[0])  # from the trace restart
    # the SYN waits in a's uplink queue until the first opportunity after the offset,
    # on each replay: restart_trace puts the trace clock back into the outage (counted
    # from the restart: a loaded host may start the client's thread late)
    for ms_round in rounds:
        assert ms_round >= first_up_ms + 2 * 80.0 - 1.0


@pytest.mark.privileged
async def test_network_start_stop_is_the_same_topology() -> None:
    _privileged()
    net = Network(get_profile("fixed", delay_ms=5), ["a", "b"], backend="userspace")
    topo = await net.start()
    prefix = topo.prefix
    try:
        assert prefix_objects(prefix)  # namespaces and links exist while it runs
        with pytest.raises(TopologyError, match="already started"):
            await net.start()
        async with open_echo_server(topo.hosts["b"]):
            _, ms = await timed_exchanges(topo.hosts["a"], topo.hosts["b"], 100, 100,
                                          count=2, fresh=False)
        assert min(ms) >= 20.0  # physics: four 5 ms crossings
    finally:
        await net.stop()
    await net.stop()  # idempotent
    assert prefix_objects(prefix) == []
