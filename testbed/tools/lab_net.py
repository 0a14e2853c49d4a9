"""A lab of "hosts" on one machine: a network namespace per host, each with its own
address on one bridge, for `testbed bench cluster`.

Rules:

- ``plan_lab(prefix, names)`` is pure: each host's namespace, interface names and
  address (198.18.255.N/24, in the testbed's own range and never routed beyond the
  lab), in order.
- ``open_lab`` records every namespace and link in the run's ledger before creating
  it: a name for this machine's own namespace (``PREFIX-machine``: a host-wide sysctl
  such as the allowed congestion controls can be written only from there, so the
  processes started in the hosts write it through that name,
  ``testbed.host.kernel.write_root_sysctl``), a namespace ``PREFIX-lan`` holding the bridge, and per host a namespace
  ``PREFIX-hN`` joined to the bridge by a veth pair (the host end carries the address,
  the bridge end stays in ``PREFIX-lan``); loopback is up in every host. Nothing is
  shaped: the hosts talk over plain veth, as machines on one switch would (with no
  wire delay). Everything is removed when the context ends (the ledger's teardown).
- ``port_bytes`` reads each host's bridge-side counters (bytes the host sent and
  received), the traffic between hosts that the benchmark divides by episodes.
- ``start_in_host`` starts a command inside a host's namespace through
  ``python -m testbed.tools.in_netns`` (setns, then exec), so the process is the
  command itself and is recorded in the ledger by pid.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, TypeVar

from testbed.host import kernel
from testbed.host.ledger import Ledger

LAB_NET = "198.18.255"
LAB_PREFIX_LEN = 24
T = TypeVar("T")


@dataclass(frozen=True)
class LabHost:
    name: str
    netns: str
    address: str
    host_if: str  # in the host's namespace
    bridge_if: str  # its peer, a port of the bridge


@dataclass(frozen=True)
class Lab:
    netns: str  # the bridge's namespace
    bridge: str
    hosts: tuple[LabHost, ...]
    machine_netns: str  # a name for this machine's own namespace (host-wide sysctls)

    def host(self, name: str) -> LabHost:
        return next(h for h in self.hosts if h.name == name)


def plan_lab(prefix: str, names: Sequence[str]) -> Lab:
    """Pure: the lab's namespaces, interfaces and addresses (module rules)."""
    if len(set(names)) != len(names) or not 1 <= len(names) <= 200:
        raise ValueError(f"names: 1-200 unique host names, got {list(names)}")
    hosts = tuple(LabHost(name, f"{prefix}-h{i}", f"{LAB_NET}.{i + 1}", f"{prefix}e{i}",
                          f"{prefix}p{i}")
                  for i, name in enumerate(names))
    return Lab(f"{prefix}-lan", f"{prefix}br", hosts, f"{prefix}-machine")


@contextlib.contextmanager
def open_lab(ledger: Ledger, names: Sequence[str]) -> Iterator[Lab]:
    """Build the lab (module rules); the ledger's teardown removes it."""
    lab = plan_lab(ledger.prefix, names)
    _build(ledger, lab)
    try:
        yield lab
    finally:
        ledger.teardown()


def _call(operation: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return kernel.kernel_call(operation, partial(fn, *args, **kwargs))


def _build(ledger: Ledger, lab: Lab) -> None:
    from pyroute2 import IPRoute
    from pyroute2 import netns as pr_netns

    ledger.record_netns(lab.machine_netns)
    kernel.attach_netns(lab.machine_netns)
    for netns in (lab.netns, *(h.netns for h in lab.hosts)):
        ledger.record_netns(netns)
        _call(f"create netns {netns}", pr_netns.create, netns)
        kernel.disable_ipv6(netns)
    with IPRoute(netns=lab.netns) as lan:
        _call(f"add bridge {lab.bridge}", lan.link, "add", ifname=lab.bridge, kind="bridge")
        bridge = _call("lookup bridge", lan.link_lookup, ifname=lab.bridge)[0]
        _call("bridge up", lan.link, "set", index=bridge, state="up")
        for h in lab.hosts:
            ledger.record_link(h.bridge_if, lab.netns)  # deleting one end removes both
            _call(f"add veth {h.bridge_if}/{h.host_if}", lan.link, "add", ifname=h.bridge_if,
                  kind="veth", peer=h.host_if)
            peer = _call(f"lookup {h.host_if}", lan.link_lookup, ifname=h.host_if)[0]
            _call(f"move {h.host_if} to {h.netns}", lan.link, "set", index=peer,
                  net_ns_fd=h.netns)
            port = _call(f"lookup {h.bridge_if}", lan.link_lookup, ifname=h.bridge_if)[0]
            _call(f"enslave {h.bridge_if}", lan.link, "set", index=port, master=bridge)
            _call(f"{h.bridge_if} up", lan.link, "set", index=port, state="up")
            with IPRoute(netns=h.netns) as ipr:
                lo = _call("lookup lo", ipr.link_lookup, ifname="lo")[0]
                _call(f"{h.netns}: lo up", ipr.link, "set", index=lo, state="up")
                index = _call(f"lookup {h.host_if}", ipr.link_lookup, ifname=h.host_if)[0]
                _call(f"{h.netns}: address {h.address}", ipr.addr, "add", index=index,
                      address=h.address, prefixlen=LAB_PREFIX_LEN)
                _call(f"{h.netns}: {h.host_if} up", ipr.link, "set", index=index, state="up")


def port_bytes(lab: Lab) -> dict[str, dict[str, int]]:
    """Per host: bytes it sent into the lab and received from it (bridge-side counters,
    so ``sent`` is the port's rx)."""
    from pyroute2 import IPRoute

    out: dict[str, dict[str, int]] = {}
    with IPRoute(netns=lab.netns) as lan:
        links = _call("lab counters", lan.get_links)
    by_name = {link.get_attr("IFLA_IFNAME"): link for link in links}
    for h in lab.hosts:
        stats: Any = by_name[h.bridge_if].get_attr("IFLA_STATS64")
        out[h.name] = {"sent_bytes": int(stats["rx_bytes"]), "received_bytes":
                       int(stats["tx_bytes"])}
    return out


def start_in_host(ledger: Ledger, lab: Lab, host: LabHost, argv: Sequence[str], *,
                  log: IO[bytes], cwd: str | None = None) -> subprocess.Popen[bytes]:
    """``argv`` as a process inside ``host``'s namespace, recorded in the ledger; it
    writes host-wide sysctls from this machine's namespace (``HOST_NETNS_ENV``)."""
    env = {**os.environ, kernel.HOST_NETNS_ENV: lab.machine_netns}
    proc = subprocess.Popen([sys.executable, "-m", "testbed.tools.in_netns", host.netns,
                             *argv], stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    ledger.record_process(proc.pid)
    return proc
