"""The link-backend seam: the interface every backend implements (userspace, netem).

The registry of backends and the choice of one for a network are in
``testbed.links.backends``.

A backend shapes the access links of hosts that already have a network namespace and
an address (``testbed.net.topology`` creates those): A->B traffic crosses A's uplink
then B's downlink, each with the profile's delay, rate (trace or fixed), loss and
queue. Everything a backend creates is recorded in the run's ledger first.

Rules:

1. ``open_links(name, profile, hosts, ...)`` is an async context manager yielding a
   :class:`LinkBackend`; on exit everything it created is gone.
2. ``restart_trace()`` restarts every link's trace clock at the offset (each episode
   starts there, so paired episodes see the same capacity) and returns replay time 0
   as a ``time.monotonic()`` value.
3. ``counters()`` are per host: packets and bytes that left each direction, and drops.
   ``statistics()`` is the backend's own health (emulator lateness and errors; empty
   where a backend has none to report); ``clear_statistics()`` starts a new window.
4. Each implementation module has ``probes()``: the functional checks the backend
   needs, each done for real in a scratch namespace recorded in a ledger, as
   :class:`ProbeResult` rows (a refusal's detail carries the kernel's errno). The
   backend works here when every one of them passes.
5. Each host gets its own link (``NetworkProfile.link_of``); a backend that cannot
   express a field of some link refuses before it creates anything (``unsupported()``
   in its module names the field and why); it never runs a link otherwise.
6. ``start_log(directory, label)`` / ``stop_log()`` write per-host, per-direction
   packet logs in Mahimahi's format where the backend can (userspace); elsewhere they
   raise UserError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from testbed.errors import HostError

BACKEND_CHOICES = ("auto", "userspace", "netem")
"""The link backends a user may ask for (a campaign's ``options.backend``, ``--backend``)."""
SIM_BACKEND = "sim"
"""Not a link backend: every episode in virtual time, nodes and links simulated
(``testbed.sim``); ``testbed run`` takes it where it takes a link backend."""
RUN_BACKEND_CHOICES = (*BACKEND_CHOICES, SIM_BACKEND)
"""What ``options.backend`` and ``testbed run --backend`` accept."""
NO_BACKEND = "none"
"""What an unshaped network (loopback) runs on."""


@dataclass(frozen=True)
class LinkHost:
    """A host whose access link a backend shapes: its namespace and IPv4 address."""

    name: str
    netns: str
    address: str


class LinkBackend(Protocol):
    """A live set of shaped access links (see the module rules)."""

    @property
    def name(self) -> str: ...

    async def restart_trace(self) -> float: ...

    async def counters(self) -> dict[str, dict[str, int]]: ...

    async def statistics(self) -> dict[str, float]: ...

    async def clear_statistics(self) -> None: ...

    async def start_log(self, directory: str, label: str) -> None: ...

    async def stop_log(self) -> None: ...

    async def fault(self, host: str, kind: str, *, seconds: float, rate: float = 1.0
                    ) -> dict[str, int]:
        """Start fault KIND (``testbed.links.core.FAULT_KINDS``) on the packets from or
        to HOST for SECONDS; returns the packets faulted so far per kind. A backend
        that cannot raises FaultUnsupported (one line)."""
        ...


class FaultUnsupported(HostError):
    """This link backend cannot inject that fault."""


@dataclass(frozen=True)
class ProbeResult:
    """One functional check: what was tried and what the host said."""

    name: str
    ok: bool
    detail: str
