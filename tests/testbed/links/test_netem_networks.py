"""netem and networks as data, pure: per-host plans, loss models, queues, refusals.

This host has no sch_netem: the kernel variants of the fidelity tests are in
tests/testbed/net/test_link_fidelity.py (marker netem) and run in the VM lane.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyroute2.netlink.rtnl.tcmsg import plugins, sched_netem, tcmsg

from testbed.errors import HostError, UserError
from testbed.links import backends, netem_loss, netem_support
from testbed.links.backend import LinkHost
from testbed.links.linkspec import GilbertLoss, LinkSpec, NetworkProfile
from testbed.links.netem import NetemBackend
from testbed.links.netem_plan import (
    gemodel_params,
    limit_frame_bytes,
    percent_u32,
    plan_direction,
    unsupported,
)

HOSTS = [LinkHost("a0", "tbq0", "198.18.0.1"), LinkHost("a1", "tbq1", "198.18.0.2"),
         LinkHost("central", "tbq2", "198.18.0.3")]


def mixed() -> NetworkProfile:
    common = LinkSpec(rate_kbit=12_000, delay_ms=20, queue_packets=50)
    return NetworkProfile("mixed", common, hosts=(
        ("1", LinkSpec(up_rate_kbit=2000, down_rate_kbit=8000, delay_ms=30,
                       gilbert=GilbertLoss(0.01, 0.2, 0.0, 100.0), trace_offset_s=4.0)),
        ("central", LinkSpec(rate_kbit=100_000, delay_ms=1, queue_kind="codel",
                             codel_target_ms=5, codel_interval_ms=100))))


def test_each_host_is_planned_from_its_own_link() -> None:
    plans = {(h, side): plan for h, side, _, plan in
             NetemBackend(mixed(), prefix="tbq").describe(HOSTS)}
    assert (plans[("a0", "up")].rate_kbit, plans[("a0", "up")].delay_ms) == (12_000, 20)
    assert (plans[("a1", "up")].rate_kbit, plans[("a1", "down")].rate_kbit) == (2000, 8000)
    assert plans[("a1", "up")].offset_ms == 4000.0
    assert plans[("a1", "down")].delay_ms == 30
    assert plans[("central", "down")].leaf_params() == (
        "codel", {"cdl_limit": 1000, "cdl_target": 5000, "cdl_interval": 100_000})
    assert plans[("a0", "up")].leaf_params() is None  # tbf's own byte fifo
    assert plans[("a0", "up")].limit_bytes == 50 * 1514


def test_gilbert_elliott_as_netem_gemodel() -> None:
    plan = plan_direction(dict(mixed().hosts)["1"], "up")
    params = plan.netem_params()
    # tc's `loss gemodel 1% 20% 100% 0%`: h is the chance of no loss in the bad state
    assert params["gemodel"] == {"p": percent_u32(1), "r": percent_u32(20), "h": 0, "k1": 0}
    assert gemodel_params(0.5, 1.0, 2.0, 60.0) == {
        "p": percent_u32(50), "r": 2**32 - 1, "h": percent_u32(40), "k1": percent_u32(2)}


def test_netem_loss_attribute_encodes_and_decodes() -> None:
    netem_loss.install()
    try:
        assert plugins["netem"] is netem_loss
        opts = netem_loss.get_parameters({"delay": 20_000, "loss": 0, "limit": 100_000,
                                          "gemodel": gemodel_params(0.01, 0.25, 0, 80)})
        msg = tcmsg()
        msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", opts]]
        msg.encode()
        back = tcmsg(msg.data)
        back.decode()
        options = back.get_attr("TCA_OPTIONS")
        assert options["loss"] == 0
        assert options["limit"] == 100_000
        ge = options.get_attr("TCA_NETEM_LOSS").get_attr("NETEM_LOSS_GE")
        assert (ge["p"], ge["r"], ge["h"], ge["k1"]) == (
            percent_u32(1), percent_u32(25), percent_u32(20), 0)
        plain = netem_loss.get_parameters({"delay": 1000, "loss": 2.0, "limit": 10})
        assert plain == sched_netem.get_parameters({"delay": 1000, "loss": 2.0, "limit": 10})
    finally:
        plugins["netem"] = sched_netem


def test_queue_bounds_count_ethernet_frames() -> None:
    assert limit_frame_bytes(10, None) == 10 * 1514  # ten full frames, not 9.9
    assert limit_frame_bytes(10, 4500) == 4542  # three full packets of IP bytes
    assert limit_frame_bytes(2, 100_000) == 2 * 1514


def test_what_netem_cannot_express_is_named(tmp_path: Path) -> None:
    delay = tmp_path / "d.txt"
    delay.write_text("0 10\n")
    varying = NetworkProfile("v", LinkSpec(delay_trace=str(delay)))
    assert unsupported(varying) == ("network v: delay_trace: the netem backend cannot vary "
                                    "the delay over time; use backend userspace")
    coded = NetworkProfile("c", LinkSpec(rate_kbit=1000, queue_kind="codel",
                                         queue_bytes=30_000))
    assert "queue.bytes: Linux's codel bounds packets only" in str(unsupported(coded))
    assert unsupported(mixed()) is None


@pytest.fixture
def both_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "probe_backend", lambda name: (True, f"{name} works"))
    monkeypatch.setattr(netem_support, "qdisc_available", lambda q: (True, f"{q} works"))


@pytest.mark.usefixtures("both_work")
def test_auto_passes_netem_over_for_what_it_cannot_run(tmp_path: Path) -> None:
    delay = tmp_path / "d.txt"
    delay.write_text("0 10\n")
    varying = NetworkProfile("v", LinkSpec(delay_trace=str(delay)))
    assert backends.resolve_backend(mixed(), "auto") == "netem"
    assert backends.resolve_backend(varying, "auto") == "userspace"
    assert backends.resolve_backend(mixed(), "auto", packet_log=True) == "userspace"
    with pytest.raises(UserError, match=r"^network v: delay_trace: the netem backend"):
        backends.resolve_backend(varying, "netem")
    with pytest.raises(UserError, match=r"^options\.link_log: the netem backend keeps no"):
        backends.resolve_backend(mixed(), "netem", packet_log=True)
    assert backends.resolve_backend(varying, "userspace", packet_log=True) == "userspace"


@pytest.mark.usefixtures("both_work")
def test_codel_without_sch_codel_is_the_hosts_lack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netem_support, "qdisc_available",
                        lambda q: (False, f"adding {q} qdisc failed: [Errno 2 ENOENT]"))
    with pytest.raises(HostError, match=r"its queue needs the kernel's codel qdisc, which "
                                        r"this host lacks"):
        backends.resolve_backend(mixed(), "netem")
    assert backends.resolve_backend(mixed(), "auto") == "userspace"
