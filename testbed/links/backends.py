"""Which link backends exist, whether they work here, and which one a network runs on.

Rules:

1. ``resolve_backend`` is the one place that turns a requested name (``auto``,
   ``userspace``, ``netem``) into the backend a profile runs on; a shaped profile never
   runs unshaped (a :class:`HostError` instead), an unshaped one never gets a backend.
2. ``auto`` takes netem where it works (kernel qdiscs, no emulator process) and can
   run the network exactly as defined, else userspace (:data:`AUTO_ORDER`); probes run
   once per process, and for root once per boot and set of kernel modules.
3. A backend asked for by name that cannot run a network as defined (a field it cannot
   express, packet logs, a qdisc the kernel lacks) is refused with that one line
   before anything is created (``BackendKind.check``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from testbed.errors import HostError, UserError
from testbed.host.ledger import Ledger
from testbed.links import netem, netem_support, userspace
from testbed.links.backend import (
    BACKEND_CHOICES,
    NO_BACKEND,
    LinkBackend,
    LinkHost,
    ProbeResult,
)
from testbed.links.probe_cache import cached_probe
from testbed.links.profiles import NetworkProfile

Opener = Callable[..., AbstractAsyncContextManager[LinkBackend]]


@dataclass(frozen=True)
class BackendKind:
    """A registered backend: how to open it and how to probe for it."""

    name: str
    open: Opener
    probes: Callable[[], list[ProbeResult]]
    summary: str
    problem: Callable[..., str | None] = lambda profile, *, packet_log=False: None
    check: Callable[..., None] = lambda profile, *, packet_log=False: None


#: ``auto`` takes the first of these that works here.
AUTO_ORDER = ("netem", "userspace")


def _kinds() -> dict[str, BackendKind]:
    return {
        "userspace": BackendKind("userspace", userspace.open_userspace_links,
                                 userspace.probes, "TUN devices + emulator process"),
        "netem": BackendKind("netem", netem.open_netem_links, netem.probes,
                             "veth pairs + kernel netem/tbf qdiscs",
                             netem_support.support_problem, netem_support.check_supported),
    }


def auto_choice(works: Mapping[str, bool]) -> str | None:
    """What ``auto`` picks given which backends work (None: only unshaped networks)."""
    return next((name for name in AUTO_ORDER if works.get(name)), None)


def backend_names() -> tuple[str, ...]:
    return tuple(_kinds())


def backend_kind(name: str) -> BackendKind:
    kinds = _kinds()
    if name not in kinds:
        raise UserError(f"backend: {name!r} is not allowed; allowed: "
                        f"{', '.join(BACKEND_CHOICES)}")
    return kinds[name]


@functools.lru_cache(maxsize=8)
def probe_backend(name: str) -> tuple[bool, str]:
    """Whether backend ``name`` works here and why (its probes, once per process and, for
    root, once per boot and set of kernel modules: ``testbed.links.probe_cache``)."""
    def probe() -> tuple[bool, str]:
        results = backend_kind(name).probes()
        failed = [r for r in results if not r.ok]
        if failed:
            return False, "; ".join(f"{r.name}: {r.detail}" for r in failed)
        return True, "; ".join(f"{r.name}: {r.detail}" for r in results)

    return cached_probe(name, probe)


def resolve_backend(profile: NetworkProfile, requested: str, *,
                    packet_log: bool = False) -> str:
    """The backend ``profile`` runs on when ``requested`` is asked for (rules 1-3).

    ``requested`` applies to shaped profiles only: an unshaped profile (loopback) runs
    with no backend whatever was asked, so a campaign mixing loopback and shaped
    networks can name one backend for the shaped ones. ``packet_log``: the run wants
    per-packet link logs (``[options] link_log``).
    """
    if requested not in (*BACKEND_CHOICES, NO_BACKEND):
        raise UserError(f"backend: {requested!r} is not allowed; allowed: "
                        f"{', '.join(BACKEND_CHOICES)}")
    if profile.link is None:
        return NO_BACKEND
    if requested == NO_BACKEND:
        raise UserError(f"backend: none would run network {profile.name!r} unshaped; "
                        "use auto, userspace or netem")
    if requested == "auto":
        works = {name: probe_backend(name)[0] for name in AUTO_ORDER}
        able = {name: ok and backend_kind(name).problem(profile, packet_log=packet_log)
                is None for name, ok in works.items()}
        choice = auto_choice(able)
        if choice is not None:
            return choice
        if auto_choice(works) is not None:  # a backend works, but none can run this network
            backend_kind(auto_choice(works) or "").check(profile, packet_log=packet_log)
        raise HostError(f"network {profile.name!r}: no link backend works here "
                        f"(userspace: {probe_backend('userspace')[1]}; netem: "
                        f"{probe_backend('netem')[1]}); see `testbed doctor`")
    works_here, detail = probe_backend(requested)
    if not works_here:
        raise HostError(f"backend {requested}: does not work on this host ({detail}); "
                        "see `testbed doctor`, or use --backend auto")
    backend_kind(requested).check(profile, packet_log=packet_log)
    return requested


def open_links(name: str, profile: NetworkProfile, hosts: Sequence[LinkHost], *,
               prefix: str, ledger: Ledger, trace_offset_s: float, seed: int,
               **options: Any) -> AbstractAsyncContextManager[LinkBackend]:
    """Open backend ``name``'s links for ``hosts`` (rules 1 and 3)."""
    kind = backend_kind(name)
    kind.check(profile, packet_log=bool(options.pop("packet_log", False)))
    return kind.open(profile, hosts, prefix=prefix, ledger=ledger,
                     trace_offset_s=trace_offset_s, seed=seed, **options)
