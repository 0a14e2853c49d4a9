"""What a topology will be, before anything touches the kernel (pure).

Rules:

- host i (agents in order, then ``central`` if asked) gets namespace
  ``<prefix>-<name>`` and address 198.18.0.0 + i + 1 (198.18.0.0/15, the benchmarking
  range);
- an unshaped profile (loopback) plans no namespace: every host is 127.0.0.1 in the
  root namespace, and its backend is ``none``;
- the backend is given, already resolved (``testbed.links.backends.resolve_backend``
  is where probing happens), and must fit the profile: shaped with ``userspace`` or
  ``netem``, unshaped with ``none``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.errors import UserError
from testbed.host.ledger import check_prefix, new_prefix
from testbed.links.backend import NO_BACKEND
from testbed.links.linkspec import CENTRAL_HOST, NetworkProfile

CENTRAL = CENTRAL_HOST
SHAPING_BACKENDS = ("userspace", "netem")
_BASE = ipaddress.IPv4Address("198.18.0.0")
_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")


class TopologyError(UserError):
    """The topology asked for is not one the testbed can build (bad input); one line."""


@dataclass(frozen=True)
class Host:
    name: str
    netns: str | None
    address: str


@dataclass(frozen=True)
class TopologyPlan:
    """What `open_topology` will build; pure data."""

    profile: NetworkProfile
    prefix: str
    backend: str
    hosts: tuple[Host, ...]
    trace_offset_s: float


def plan_topology(
    profile: NetworkProfile,
    agents: Sequence[str],
    *,
    central: bool = False,
    prefix: str | None = None,
    trace_offset_s: float = 0.0,
    backend: str = NO_BACKEND,
) -> TopologyPlan:
    """Validate the input and name everything; touches nothing."""
    names = list(agents)
    if not names:
        raise TopologyError("agents: give at least one agent name")
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TopologyError(f"agents: {name!r} must be 1-32 letters, digits or _")
    if central:
        if CENTRAL in names:
            raise TopologyError(f"agents: {CENTRAL!r} is reserved for the central host")
        names.append(CENTRAL)
    if len(set(names)) != len(names):
        raise TopologyError("agents: names must be unique")
    if not (isinstance(trace_offset_s, int | float) and 0 <= trace_offset_s < 1e6):
        raise TopologyError(f"trace_offset_s: a number >= 0, got {trace_offset_s!r}")
    run_prefix = check_prefix(prefix) if prefix is not None else new_prefix()
    shaped = profile.link is not None
    if backend not in (*SHAPING_BACKENDS, NO_BACKEND):
        raise TopologyError(f"backend: {backend!r} is not one of "
                            f"{', '.join((*SHAPING_BACKENDS, NO_BACKEND))}")
    if shaped and backend == NO_BACKEND:
        raise TopologyError(f"backend: none would run profile {profile.name!r} unshaped; "
                            f"use {' or '.join(SHAPING_BACKENDS)}")
    if not shaped and backend != NO_BACKEND:
        raise TopologyError(f"backend: profile {profile.name!r} has no link to shape; "
                            "use none")
    if not shaped:
        hosts = tuple(Host(n, None, "127.0.0.1") for n in names)
    else:
        hosts = tuple(Host(n, f"{run_prefix}-{n}", str(_BASE + i + 1))
                      for i, n in enumerate(names))
    return TopologyPlan(profile, run_prefix, backend, hosts, float(trace_offset_s))
