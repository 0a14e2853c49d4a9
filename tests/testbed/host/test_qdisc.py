"""Qdisc changes over the raw rtnetlink fast path land exactly as pyroute2's own
``tc("change")`` does (privileged: a real tbf on a scratch veth; this host has tbf and
htb, so it runs here, not only in the VM lane)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from testbed.host.kernel import KernelError
from testbed.host.qdisc import CHANGE_FLAGS, RTM_NEWQDISC, QdiscChanges, encode_change
from testbed.links.netem import probe_qdisc, scratch_veth
from testbed.links.netem_plan import tbf_params

TBF, UNDER = 0x100000, 0x10001  # 10:0 under class 1:1


def test_the_message_is_pyroute2s_change() -> None:
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    raw = encode_change("tbf", 7, handle=TBF, parent=UNDER, **tbf_params(1200, limit_bytes=9000))
    msg = tcmsg(raw)
    msg.decode()
    assert (msg["header"]["type"], msg["header"]["flags"]) == (RTM_NEWQDISC, CHANGE_FLAGS)
    assert (msg["index"], msg["handle"], msg["parent"]) == (7, TBF, UNDER)
    assert msg.get_attr("TCA_KIND") == "tbf"
    parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
    assert (parms["rate"], parms["limit"]) == (150_000, 9000)


def _tbf(ipr: Any, index: int) -> tuple[int, int, int]:
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") == "tbf":
            p = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            return int(p["rate"]), int(p["buffer"]), int(p["limit"])
    raise AssertionError("no tbf")


@pytest.mark.privileged
def test_fast_changes_equal_pyroute2_changes() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    for kind, params in (("htb", {"default": 1}), ("tbf", tbf_params(1000, limit_bytes=15_000))):
        ok, why = probe_qdisc(kind, params)
        if not ok:
            pytest.skip(f"{kind} unavailable here: {why}")
    with scratch_veth() as (netns, ifname, ipr):
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.tc("add", "htb", index, handle="1:0", default=1)
        ipr.tc("add-class", "htb", index, handle="1:1", parent="1:0", rate="10gbit",
               ceil="10gbit")
        ipr.tc("add", "tbf", index, handle="10:0", parent="1:1",
               **tbf_params(12_000, limit_bytes=150_000))
        fast = QdiscChanges(netns)
        try:
            for rate in (0.0, 1200.0, 2400.0, 12_000.0, 235_200.0, 1200.0):
                params = tbf_params(rate, limit_bytes=150_000)
                fast.change("tbf", index, handle=TBF, parent=UNDER, **params)
                by_fast = _tbf(ipr, index)
                ipr.tc("change", "tbf", index, handle="10:0", parent="1:1", **params)
                assert by_fast == _tbf(ipr, index) == (params["rate"], by_fast[1], 150_000)
            with pytest.raises(KernelError) as refused:
                fast.change("tbf", index + 1000, handle=TBF, parent=UNDER, **params)
            assert refused.value.errno == 19  # ENODEV
        finally:
            fast.close()


def _arrivals_after_a_rate_rise(kick: bool) -> list[float]:
    """Five 1400-byte datagrams into a tbf at the zero floor, then 12 Mbit/s after 0.1 s
    (with or without a kick); their arrival times (s) from the rate change."""
    import socket
    import threading
    import time

    from pyroute2 import IPRoute

    from testbed.host import kernel

    with scratch_veth() as (netns, ifname, ipr):
        far = f"{netns}far"
        kernel.create_netns(far)
        try:
            index = ipr.link_lookup(ifname=ifname)[0]
            peer = ifname[:-1] + "b"
            ipr.link("set", index=ipr.link_lookup(ifname=peer)[0], net_ns_fd=far)
            ipr.addr("add", index=index, address="198.18.9.1", prefixlen=24)
            with IPRoute(netns=far) as other:
                pi = other.link_lookup(ifname=peer)[0]
                other.addr("add", index=pi, address="198.18.9.2", prefixlen=24)
                other.link("set", index=pi, state="up")
            ipr.tc("add", "tbf", index, handle="10:0", **tbf_params(0.0, limit_bytes=150_000))
            rx = kernel.socket_in_netns(far, socket.AF_INET, socket.SOCK_DGRAM)
            tx = kernel.socket_in_netns(netns, socket.AF_INET, socket.SOCK_DGRAM)
            rx.bind(("198.18.9.2", 9999))
            rx.settimeout(3.0)
            seen: list[float] = []

            def receive() -> None:
                try:
                    while len(seen) < 5:
                        rx.recv(2048)
                        seen.append(time.monotonic())
                except TimeoutError:
                    pass

            thread = threading.Thread(target=receive)
            thread.start()
            fast = QdiscChanges(netns)
            try:
                for _ in range(5):
                    tx.sendto(bytes(1400), ("198.18.9.2", 9999))
                time.sleep(0.1)
                fast.change("tbf", index, handle=TBF, parent=0xFFFFFFFF,
                            **tbf_params(12_000.0, limit_bytes=150_000))
                changed = time.monotonic()
                if kick:
                    fast.kick(ifname)
                thread.join()
            finally:
                fast.close()
                rx.close()
                tx.close()
            return [t - changed for t in seen]
        finally:
            kernel.remove_netns(far)


@pytest.mark.privileged
def test_a_kick_wakes_a_tbf_that_sleeps_on_its_old_rate() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    ok, why = probe_qdisc("tbf", tbf_params(1000, limit_bytes=15_000))
    if not ok:
        pytest.skip(f"tbf unavailable here: {why}")
    # Without a kick the backlog may wait for the timer set at 8 kbit/s (a frame: 1.4 s,
    # less what the bucket held): it did in the guest kernel, but not in every run here,
    # where a change sometimes finds the watchdog unarmed, so that case is no assertion.
    # With a kick the backlog always leaves at 12 Mbit/s (1 ms a frame).
    woken = _arrivals_after_a_rate_rise(kick=True)
    assert len(woken) == 5, woken
    assert max(woken) < 0.1
