"""Where the delay sits, per-direction links and the queues only one backend runs.

- ``order``: ``link_then_delay`` (queue at the trace, then the delay), ``delay_then_link``
  and ``mahimahi`` (``mm-delay D mm-link``: the uplink queues first, the downlink is
  delayed first), in the pure model, and the netem backend's way of keeping it (its
  schedule played ``delay_ms`` later) checked against the model;
- ``up_delay_ms`` / ``down_delay_ms``, ``up_loss`` / ``down_loss``, ``up_queue`` /
  ``down_queue`` from a table to both backends' plans, and back;
- drop-head on both backends; PIE and fq_codel on netem, refused by userspace.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from testbed.errors import UserError
from testbed.links import backends, netem_support
from testbed.links.linkspec import LinkSpec, LossSpec, NetworkProfile, QueueSpec
from testbed.links.model import LinkQueue, TraceOpportunities, direction_spec
from testbed.links.netdef import network_to_data, parse_network
from testbed.links.netem_plan import plan_direction, qdiscs_needed, unsupported
from testbed.links.netinfo import link_info, rtt_range_ms
from testbed.links.userspace_support import support_problem

STAMPS = [*range(0, 100, 1), *range(300, 400, 1), 400]  # an outage from 100 to 300 ms
PERIOD = 400


def _exits(queue: LinkQueue, arrivals: list[float], until_ms: float = 10_000.0,
           ) -> list[tuple[float, int]]:
    for i, t in enumerate(arrivals):
        queue.advance(t)
        queue.offer(i, 1500, t)
    out = queue.advance(until_ms)
    return sorted((round(t, 6), item) for t, item in out)


def test_the_order_decides_which_side_of_an_outage_a_packet_meets() -> None:
    trace = TraceOpportunities(STAMPS, PERIOD)
    first = LinkQueue(trace, delay_ms=20.0)
    after = LinkQueue(trace, delay_ms=20.0, delay_first=True)
    # offered at 90 ms: link first leaves at 90 and arrives at 110; delay first reaches
    # the queue at 110, inside the outage, and waits for 300
    assert _exits(first, [90.0]) == [(110.0, 0)]
    assert _exits(after, [90.0]) == [(300.0, 0)]


def test_mahimahis_order_queues_the_uplink_first_and_delays_the_downlink_first() -> None:
    link = LinkSpec(rate_kbit=1200, delay_ms=10, order="mahimahi")
    up, down = link.sides
    assert (up.delay_first, down.delay_first) == (False, True)
    assert [s.delay_first for s in LinkSpec(order="delay_then_link").sides] == [True, True]
    assert [s.delay_first for s in LinkSpec().sides] == [False, False]
    assert direction_spec(link, "down").delay_first
    assert not direction_spec(link, "up").delay_first
    assert plan_direction(link, "up").schedule_shift_ms == 10.0
    assert plan_direction(link, "down").schedule_shift_ms == 0.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_netems_shifted_schedule_is_the_models_link_then_delay(seed: int) -> None:
    """netem delays before it shapes; played d later, the trace gives exactly the
    departures (and drops) of queueing first and delaying after."""
    rng = random.Random(seed)
    delay, offset = 35.0, 120.0
    arrivals = sorted(rng.uniform(0, 1200) for _ in range(500))
    link_first = LinkQueue(TraceOpportunities(STAMPS, PERIOD, offset), delay_ms=delay,
                           queue_packets=40)
    shifted = TraceOpportunities(STAMPS, PERIOD, (offset - delay) % PERIOD)
    kernel_like = LinkQueue(shifted, delay_ms=delay, queue_packets=40, delay_first=True)
    assert _exits(link_first, arrivals) == _exits(kernel_like, arrivals)
    assert link_first.counters.drops == kernel_like.counters.drops > 0


def test_a_delay_trace_applies_before_the_queue_and_keeps_the_path_fifo() -> None:
    from testbed.links.opportunities import DelaySteps

    queue = LinkQueue(None, delays=DelaySteps(((0.0, 50.0), (10.0, 5.0))), delay_first=True)
    assert _exits(queue, [9.0, 11.0]) == [(59.0, 0), (59.0, 1)]  # 1 waits behind 0


TABLE = {
    "rate_kbit": 1200, "delay_ms": 10, "up_delay_ms": 5, "down_delay_ms": 30,
    "loss": {"model": "iid", "pct": 1.0}, "down_loss": {"model": "none"},
    "up_queue": {"kind": "drophead", "packets": 50},
    "down_queue": {"kind": "pie", "packets": 200, "target_ms": 20},
    "order": "mahimahi",
}


def test_per_direction_fields_parse_plan_and_write_back() -> None:
    profile = parse_network("split", TABLE)
    link = profile.link
    assert link is not None
    up, down = link.sides
    assert (up.delay_ms, down.delay_ms) == (5.0, 30.0)
    assert (up.loss_pct, down.loss_pct) == (1.0, 0.0)
    assert up.queue == QueueSpec("drophead", 50)
    assert down.queue == QueueSpec("pie", 200, target_ms=20.0)
    assert profile.base_rtt_ms == 2 * (5 + 30)
    assert rtt_range_ms(profile, 2)["agents"] == (70.0, 70.0)
    assert parse_network("split", network_to_data(profile)) == profile
    assert link_info(link).delay_ms == {"up": (5.0, 5.0), "down": (30.0, 30.0)}
    plan_up, plan_down = plan_direction(link, "up"), plan_direction(link, "down")
    assert (plan_up.delay_ms, plan_down.delay_ms) == (5.0, 30.0)
    assert plan_up.leaf_params() == ("pfifo_head_drop", {"limit": 50})
    assert plan_down.leaf_params() == ("pie", {"limit": 200, "target": 20_000,
                                               "tupdate": 15_000})
    assert (plan_up.loss_pct, plan_down.loss_pct) == (1.0, 0.0)
    assert qdiscs_needed(profile) == ["pfifo_head_drop", "pie"]
    assert unsupported(profile) is None
    assert direction_spec(link, "up").queue_kind == "drophead"
    assert direction_spec(link, "up").delay_ms == 5.0


def test_fq_codel_and_codel_leaves_carry_their_settings() -> None:
    fq = LinkSpec(rate_kbit=1000, up_queue=QueueSpec("fq_codel", 300, target_ms=4,
                                                     interval_ms=80, flows=64))
    assert plan_direction(fq, "up").leaf_params() == ("fq_codel", {
        "fqc_limit": 300, "fqc_target": 4000, "fqc_interval": 80_000, "fqc_flows": 64})
    assert plan_direction(fq, "down").leaf_params() is None  # tbf's own drop-tail fifo


def test_userspace_refuses_the_kernels_queues_in_one_line() -> None:
    profile = parse_network("split", TABLE)
    assert support_problem(profile) == (
        "network split: down_queue.kind pie: the userspace backend does not model pie (it "
        "has droptail, drophead, codel); use backend netem, which runs the kernel's")
    with pytest.raises(UserError, match=r"^network split: down_queue\.kind pie"):
        backends.backend_kind("userspace").check(profile)
    common = NetworkProfile("f", LinkSpec(rate_kbit=100, queue_kind="fq_codel"))
    assert "queue.kind fq_codel" in str(support_problem(common))
    assert support_problem(NetworkProfile("h", LinkSpec(rate_kbit=100,
                                                        queue_kind="drophead"))) is None


def test_auto_takes_the_backend_that_runs_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "probe_backend", lambda name: (True, f"{name} works"))
    monkeypatch.setattr(netem_support, "qdisc_available", lambda q: (True, f"{q} works"))
    pie = NetworkProfile("p", LinkSpec(rate_kbit=100, queue_kind="pie"))
    assert backends.resolve_backend(pie, "auto") == "netem"
    monkeypatch.setattr(backends, "probe_backend",
                        lambda name: (name == "userspace", f"{name}: maybe"))
    with pytest.raises(UserError, match=r"^network p: queue\.kind pie: the userspace backend"):
        backends.resolve_backend(pie, "auto")


@pytest.mark.parametrize(("table", "message"), [
    ({"up_delay_ms": -1}, "networks.x.up_delay_ms: -1 is not allowed"),
    ({"down_loss": {"model": "iid", "pct": 100}}, "networks.x.down_loss.pct: 100 is not"),
    ({"up_queue": {"kind": "red"}}, "networks.x.up_queue.kind: 'red' is not allowed"),
    ({"up_queue": {"kind": "pie", "interval_ms": 5}, "rate_kbit": 10},
     "networks.x.up_queue: unknown field 'interval_ms'; allowed: kind, packets, bytes, "
     "target_ms, tupdate_ms"),
    ({"down_queue": {"kind": "fq_codel", "flows": 0}, "rate_kbit": 10},
     "networks.x.down_queue.flows: 0 is not allowed"),
    ({"up_queue": {"kind": "codel"}, "down_rate_kbit": 10},
     "networks.x.up_queue.kind: codel needs a bottleneck (traces or a rate) on the uplink"),
    ({"order": "sideways"}, "networks.x.order: 'sideways' is not allowed; allowed: "
                            "link_then_delay, delay_then_link, mahimahi"),
])
def test_bad_per_direction_fields_name_themselves(table: dict[str, object],
                                                  message: str) -> None:
    with pytest.raises(UserError) as info:
        parse_network("x", table)
    assert str(info.value).startswith(message), str(info.value)


def test_a_host_giving_one_delay_field_replaces_the_whole_group(tmp_path: Path) -> None:
    table = {"rate_kbit": 100, "up_delay_ms": 5, "down_delay_ms": 7,
             "up_queue": {"kind": "drophead"},
             "hosts": {"0": {"network": "x", "delay_ms": 50},
                       "1": {"network": "x", "queue": {"packets": 9}}}}
    profile = parse_network("x", table)
    hosts = dict(profile.hosts)
    assert [s.delay_ms for s in hosts["0"].sides] == [50.0, 50.0]
    assert hosts["0"].up_queue == QueueSpec("drophead")  # another group: kept
    assert [s.queue for s in hosts["1"].sides] == [QueueSpec(packets=9)] * 2
    assert [s.delay_ms for s in hosts["1"].sides] == [5.0, 7.0]


def test_loss_per_direction_reaches_the_model() -> None:
    link = LinkSpec(up_loss=LossSpec(pct=50.0))
    assert direction_spec(link, "up").loss_pct == 50.0
    assert direction_spec(link, "down").loss_pct == 0.0
