"""A frozen link emulator cannot pass unseen: packets that waited in the TUN queues
while the emulator was stopped count as its lateness (``late_max_ms``), which the
episode's disturbance verdict reads (testbed/results/verdict.py)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
import trio

from testbed.links.profiles import get_profile
from testbed.links.userspace import UserspaceLinks
from testbed.net.topology import open_topology
from testbed.results.verdict import judge
from testbed.tools.echo_probe import open_echo_server, timed_exchanges
from tests.leftovers import watch_runs

FREEZE_S = 2.0


def _privileged() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")


async def _exchange(freeze_s: float) -> tuple[dict[str, float], list[float]]:
    """Echo exchanges over a 5 ms link, started while the emulator is SIGSTOPped for
    ``freeze_s`` (0: not at all), so no packet is inside the emulator when it freezes
    (the case release lateness alone missed); the link statistics and the exchanges'
    durations."""
    profile = get_profile("fixed", delay_ms=5.0)
    async with open_topology(profile, ["a", "b"], backend="userspace") as topo:
        assert isinstance(topo.links, UserspaceLinks)
        pid = topo.links.emulator.process.pid
        a, b = topo.hosts["a"], topo.hosts["b"]
        durations: list[float] = []
        async with open_echo_server(b):
            await topo.clear_link_statistics()
            await trio.sleep(0.2)  # the link idle: nothing in flight
            if freeze_s:
                os.kill(pid, signal.SIGSTOP)
            try:
                async with trio.open_nursery() as nursery:
                    async def run() -> None:
                        _, got = await timed_exchanges(a, b, 200, 200, count=60,
                                                       fresh=True)
                        durations.extend(got)

                    nursery.start_soon(run)
                    await trio.sleep(freeze_s)
                    if freeze_s:
                        os.kill(pid, signal.SIGCONT)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return await topo.link_statistics(), durations


@pytest.mark.privileged
async def test_a_frozen_emulator_shows_as_lateness_and_flags_the_episode() -> None:
    _privileged()
    with watch_runs():
        calm, calm_durations = await _exchange(0.0)
        frozen, durations = await _exchange(FREEZE_S)
    assert max(durations) >= 1000 * FREEZE_S * 0.8  # an exchange waited out the freeze
    assert frozen["late_max_ms"] >= 1000 * FREEZE_S * 0.8, frozen
    assert calm["late_max_ms"] < 500, calm  # no freeze: nothing near it
    # the verdict of an episode whose 60 actions stalled ~20 ms each, plus the freeze
    stall = (sum(durations) / len(durations))
    flagged, reason = judge({"emulator_late_max_ms": frozen["late_max_ms"]},
                            stall_ms_per_action=stall, actions=len(durations), shaped=True)
    assert flagged, reason
    assert reason.startswith("emulator late")
    calm_stall = sum(calm_durations) / len(calm_durations)
    assert not judge({"emulator_late_max_ms": calm["late_max_ms"]},
                     stall_ms_per_action=calm_stall, actions=len(calm_durations),
                     shaped=True)[0]
