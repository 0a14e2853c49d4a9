"""What a run checks before it creates anything; ``testbed check`` runs the same checks.

Rules:

1. Everything a run would otherwise meet at its first topology is checked before the
   run directory exists, for every shaped network of the grid: the backend it runs on
   (``testbed.links.backends.resolve_backend``: the backend's probes, the fields it
   cannot express, CoDel's sch_codel) and every congestion control its hosts use
   (present in this kernel's ``tcp_available_congestion_control``). A failure is one
   line: :class:`HostError` for what this host lacks, :class:`UserError` for a choice
   the campaign made that no backend here can run.
2. Probing a backend builds scratch namespaces, so it needs root (or a run's own user
   namespace). ``testbed check`` as another user skips the probes and says so; the run
   itself always probes.
3. A cluster run's workers choose their own backends (``DaskEngine.survey``); nothing
   is probed on this host for it.
"""

from __future__ import annotations

import os

from testbed.campaign.model import Campaign
from testbed.errors import HostError
from testbed.host.kernel import get_sysctl
from testbed.links.backends import resolve_backend
from testbed.links.linkspec import NetworkProfile

AVAILABLE_CC = "net.ipv4.tcp_available_congestion_control"


def available_congestion_controls() -> list[str]:
    """The TCP congestion controls this kernel offers now (loaded modules included)."""
    try:
        return get_sysctl(None, AVAILABLE_CC).split()
    except OSError as exc:
        raise HostError(f"{AVAILABLE_CC}: unreadable here ({exc}); a run needs "
                        "/proc/sys mounted") from None


def congestion_controls(profile: NetworkProfile) -> dict[str, str]:
    """field -> congestion control, for every one PROFILE's hosts use."""
    return {f"networks.{profile.name}.congestion_control": profile.congestion_control}


def check_congestion_controls(campaign: Campaign) -> None:
    """Rule 1: every shaped network's congestion controls exist in this kernel."""
    available: list[str] | None = None
    for name in campaign.network_names():
        profile = campaign.network_profile(name)
        if profile.link is None:
            continue
        for field, cc in congestion_controls(profile).items():
            if available is None:
                available = available_congestion_controls()
            if cc not in available:
                raise HostError(f"{field}: {cc!r} is not available on this host; available: "
                                f"{', '.join(available)} (load another with modprobe "
                                f"tcp_{cc}, or choose one of these)")


def resolve_backends(campaign: Campaign, backend: str) -> dict[str, str]:
    """Rule 1: network -> the backend it runs on here (probing once per process)."""
    return {name: resolve_backend(campaign.network_profile(name), backend,
                                  packet_log=campaign.options.link_log)
            for name in campaign.network_names()}


def preflight(campaign: Campaign, backend: str | None = None, *,
              probe: bool | None = None) -> dict[str, str] | None:
    """Every check of rule 1; the backends chosen, or None when PROBE is false (rule 2;
    default: probe as root)."""
    check_congestion_controls(campaign)
    if probe is None:
        probe = os.geteuid() == 0
    if not probe:
        return None
    return resolve_backends(campaign, backend or campaign.options.backend)
