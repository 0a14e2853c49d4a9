"""The registry of networks: every name a campaign may write in ``[grid] network``.

Rules:

- the registry is the one list of network names: campaign files accept exactly these
  (plus the networks the campaign defines itself), reports label and order them by it;
- the built-in networks are data, shipped as ``testbed/links/presets/networks.toml`` in
  the format of a campaign's ``[networks.NAME]`` tables (``testbed.links.netdef``), and
  registered in file order when this module is imported;
- :func:`register_profile` (a name and one link for every host) and
  :func:`register_network` (a whole :class:`NetworkProfile`) add more;
- :func:`get_profile` builds a registered network with optional overrides of its links
  (delay, rate, loss, queue) and congestion control.

The data classes and their rules are in ``testbed.links.linkspec``. Nothing here
touches the kernel; backends (userspace, netem) read these objects.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from testbed.links.linkspec import (
    DEFAULT_CONGESTION_CONTROL,
    DEFAULT_DELAY_MS,
    DEFAULT_QUEUE_PACKETS,
    GilbertLoss,
    LinkSpec,
    NetworkProfile,
    ProfileError,
    check_congestion_control,
)
from testbed.links.netdef import parse_network
from testbed.links.traces import trace_catalogue

__all__ = [
    "DEFAULT_CONGESTION_CONTROL",
    "DEFAULT_DELAY_MS",
    "DEFAULT_QUEUE_PACKETS",
    "TRACE_PROFILES",
    "GilbertLoss",
    "LinkSpec",
    "NetworkProfile",
    "ProfileError",
    "builtin_names",
    "get_profile",
    "network_template",
    "profile_names",
    "register_network",
    "register_profile",
    "unregister_profile",
]

PRESETS_PACKAGE = "testbed.links"
PRESETS_FILE = "presets/networks.toml"

_REGISTRY: dict[str, NetworkProfile] = {}
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def register_network(profile: NetworkProfile) -> None:
    """Make ``profile.name`` a network a campaign can use, with all of its links."""
    if not _NAME.match(profile.name) or profile.name in _REGISTRY:
        raise ValueError(f"profile name {profile.name!r}: taken, or not 1-32 of a-z, 0-9, _")
    _REGISTRY[profile.name] = profile


def register_profile(name: str, link: LinkSpec | None) -> None:
    """Make ``name`` a network a campaign can use: ``link`` is every host's access link
    (None: loopback-like, no namespaces and no shaping)."""
    register_network(NetworkProfile(name=name, link=link))


def unregister_profile(name: str) -> None:
    """Forget a registered profile (tests and notebooks that registered their own)."""
    _REGISTRY.pop(name, None)


def profile_names() -> tuple[str, ...]:
    """Every registered network name, in registration order."""
    return tuple(_REGISTRY)


def network_template(name: str) -> NetworkProfile | None:
    """The registered network NAME as registered (no overrides, no checks), or None."""
    return _REGISTRY.get(name)


def _load_presets() -> tuple[str, ...]:
    text = (resources.files(PRESETS_PACKAGE) / PRESETS_FILE).read_text()
    tables = tomllib.loads(text).get("networks", {})
    names = []
    for name, table in tables.items():
        register_network(parse_network(name, table, where=f"{PRESETS_FILE}: networks",
                                       known=network_template, check_files=False))
        names.append(name)
    return tuple(names)


_BUILTIN = _load_presets()

TRACE_PROFILES: dict[str, tuple[str, str]] = {
    name: (p.link.up_trace, p.link.down_trace)
    for name in _BUILTIN
    if (p := _REGISTRY[name]).link is not None and p.link.up_trace is not None
    and p.link.down_trace is not None
}
"""Built-in network -> (uplink trace, downlink trace), names from `trace_catalogue()`."""


def builtin_names() -> tuple[str, ...]:
    """The networks shipped as presets (``presets/networks.toml``), in file order."""
    return _BUILTIN


def _check_traces(profile: NetworkProfile) -> None:
    catalogue = trace_catalogue()
    for link in profile.links():
        for trace in (link.up_trace, link.down_trace, link.delay_trace):
            if trace is None:
                continue
            if Path(trace).is_absolute():
                if not Path(trace).is_file():
                    raise ProfileError(f"network: profile {profile.name!r} needs the file "
                                       f"{trace}, which does not exist")
            elif trace not in catalogue:
                raise ProfileError(
                    f"network: profile {profile.name!r} needs trace {trace!r}, which is "
                    "missing from the trace folder (see `testbed traces list`)"
                )


def get_profile(
    name: str,
    *,
    delay_ms: float | None = None,
    rate_kbit: float | None = None,
    loss_pct: float | None = None,
    queue_packets: int | None = None,
    queue_bytes: int | None = None,
    congestion_control: str | None = None,
) -> NetworkProfile:
    """Build a registered profile, with optional overrides (None keeps the default).

    The link overrides apply to every access link of the network (its common link and
    its hosts' own). `rate_kbit` is accepted only by profiles without traces; an
    unshaped profile (loopback) accepts no link overrides.
    """
    base = _REGISTRY.get(name)
    if base is None:
        raise ProfileError(
            f"network: unknown profile {name!r}; allowed: {', '.join(profile_names())}"
        )
    cc = check_congestion_control(
        base.congestion_control if congestion_control is None else congestion_control)
    overrides: dict[str, Any] = {
        "delay_ms": delay_ms,
        "rate_kbit": rate_kbit,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        "queue_bytes": queue_bytes,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    if base.link is None:
        if given:
            field = next(iter(given))
            shaped = [p for p, prof in _REGISTRY.items() if prof.link is not None]
            raise ProfileError(
                f"{field}: the {name} profile has no link to shape; "
                f"allowed only with: {', '.join(shaped)}"
            )
        return replace(base, congestion_control=cc)
    if "rate_kbit" in given and any(link.trace_driven for link in base.links()):
        untraced = [p for p, prof in _REGISTRY.items()
                    if prof.link is not None and not any(lk.trace_driven for lk in prof.links())]
        raise ProfileError(
            f"rate_kbit: profile {name!r} takes its rate from its traces; "
            f"rate_kbit is allowed only with: {', '.join(untraced)}"
        )
    _check_traces(base)
    if "delay_ms" in given:  # a delay override replaces a delay trace and per-direction
        given.update(delay_trace=None, up_delay_ms=None, down_delay_ms=None)  # delays
    if "loss_pct" in given:
        given.update(gilbert=None, up_loss=None, down_loss=None)
    if "queue_packets" in given or "queue_bytes" in given:
        given.update(up_queue=None, down_queue=None)
    link = base.link.with_overrides(**given) if given else base.link
    hosts = tuple((sel, lk.with_overrides(**given) if given else lk) for sel, lk in base.hosts)
    return replace(base, link=link, hosts=hosts, congestion_control=cc)
