"""Network profiles: what each agent's access link looks like, as plain data.

Rules:

- a profile describes one access link per host; every host gets the same one;
- traffic from agent A to agent B crosses A's uplink then B's downlink; each crossing
  adds `delay_ms` of one-way propagation, so a request/response pays 4 x delay_ms
  (80 ms for the default 20 ms) plus queueing and serialisation;
- a link is shaped by a trace pair (up, down), or by a fixed `rate_kbit` in both
  directions, or only delayed (fixed profile without a rate);
- each direction has a drop-tail queue bounded by `queue_packets` and, optionally,
  `queue_bytes`; a packet that arrives at a full queue is dropped (TCP retransmits);
- `loopback` has no link at all (`link is None`): hosts share the root namespace.

Profiles are registered by name (:func:`register_profile`); the registry is the one
list of network names: campaign files accept exactly these, reports label them.
Nothing here touches the kernel; backends (userspace, netem) read these objects.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from testbed.errors import UserError
from testbed.links.traces import trace_catalogue

__all__ = [
    "DEFAULT_CONGESTION_CONTROL",
    "DEFAULT_DELAY_MS",
    "DEFAULT_QUEUE_PACKETS",
    "TRACE_PROFILES",
    "LinkSpec",
    "NetworkProfile",
    "ProfileError",
    "get_profile",
    "profile_names",
    "register_profile",
]

DEFAULT_DELAY_MS = 20.0
DEFAULT_QUEUE_PACKETS = 1000
"""Drop-tail bound per direction; like Linux's default txqueuelen (1.5 MB of full packets)."""
DEFAULT_CONGESTION_CONTROL = "cubic"
MIN_QUEUE_BYTES = 1500  # one full-size packet must fit, or the link could carry nothing

TRACE_PROFILES: dict[str, tuple[str, str]] = {
    "att": ("ATT-LTE-driving.up", "ATT-LTE-driving.down"),
    "att2016": ("ATT-LTE-driving-2016.up", "ATT-LTE-driving-2016.down"),
    "tmobile": ("TMobile-LTE-short.up", "TMobile-LTE-short.down"),
    "verizon": ("Verizon-LTE-short.up", "Verizon-LTE-short.down"),
}
"""Profile name -> (uplink trace, downlink trace), names from `trace_catalogue()`."""

_CC_NAME = re.compile(r"^[a-z0-9_]{1,15}$")


class ProfileError(UserError):
    """Bad profile input from the user; the message names the field and allowed values."""


def _check_number(field: str, value: float, *, low: float, high: float | None = None,
                  low_open: bool = False, high_open: bool = False) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    if not bad:
        bad = value < low or (low_open and value == low)
        if high is not None:
            bad = bad or value > high or (high_open and value == high)
    if bad:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f" and {'<' if high_open else '<='} {high:g}"
        raise ProfileError(f"{field}: {value!r} is not allowed; use a number {lo}{hi}")


@dataclass(frozen=True)
class LinkSpec:
    """One host's access link, both directions.

    Either both traces are set (trace-driven) or neither; `rate_kbit` applies only
    without traces (None = no rate limit, delay only).
    """

    up_trace: str | None = None
    down_trace: str | None = None
    rate_kbit: float | None = None
    delay_ms: float = DEFAULT_DELAY_MS
    loss_pct: float = 0.0
    queue_packets: int = DEFAULT_QUEUE_PACKETS
    queue_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.up_trace is None) != (self.down_trace is None):
            raise ProfileError("up_trace/down_trace: set both trace names or neither")
        if self.up_trace is not None and self.rate_kbit is not None:
            raise ProfileError(
                "rate_kbit: a trace-driven link takes its rate from the traces; use None"
            )
        if self.rate_kbit is not None:
            _check_number("rate_kbit", self.rate_kbit, low=0.0, low_open=True)
        _check_number("delay_ms", self.delay_ms, low=0.0, high=10_000.0)
        _check_number("loss_pct", self.loss_pct, low=0.0, high=100.0, high_open=True)
        if (isinstance(self.queue_packets, bool) or not isinstance(self.queue_packets, int)
                or self.queue_packets < 1):
            raise ProfileError(
                f"queue_packets: {self.queue_packets!r} is not allowed; use an integer >= 1"
            )
        if self.queue_bytes is not None and (
            isinstance(self.queue_bytes, bool) or not isinstance(self.queue_bytes, int)
            or self.queue_bytes < MIN_QUEUE_BYTES
        ):
            raise ProfileError(
                f"queue_bytes: {self.queue_bytes!r} is not allowed; use None or an "
                f"integer >= {MIN_QUEUE_BYTES}"
            )

    @property
    def trace_driven(self) -> bool:
        return self.up_trace is not None


@dataclass(frozen=True)
class NetworkProfile:
    """A named network setting; `link is None` means loopback (no namespaces, no shaping)."""

    name: str
    link: LinkSpec | None
    congestion_control: str = DEFAULT_CONGESTION_CONTROL

    @property
    def base_rtt_ms(self) -> float:
        """Propagation-only round trip agent -> agent -> agent (four link crossings)."""
        return 0.0 if self.link is None else 4.0 * self.link.delay_ms


_REGISTRY: dict[str, LinkSpec | None] = {}


def register_profile(name: str, link: LinkSpec | None) -> None:
    """Make ``name`` a network a campaign can use: ``link`` is every host's access link
    (None: loopback-like, no namespaces and no shaping)."""
    if not re.match(r"^[a-z][a-z0-9_]{0,31}$", name) or name in _REGISTRY:
        raise ValueError(f"profile name {name!r}: taken, or not 1-32 of a-z, 0-9, _")
    _REGISTRY[name] = link


def unregister_profile(name: str) -> None:
    """Forget a registered profile (tests and notebooks that registered their own)."""
    _REGISTRY.pop(name, None)


def profile_names() -> tuple[str, ...]:
    """Every registered network name, in registration order."""
    return tuple(_REGISTRY)


register_profile("loopback", None)
register_profile("fixed", LinkSpec())
for _name, (_up, _down) in TRACE_PROFILES.items():
    register_profile(_name, LinkSpec(up_trace=_up, down_trace=_down))


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

    `rate_kbit` is accepted only by profiles without traces; an unshaped profile
    (loopback) accepts no link overrides.
    """
    if name not in _REGISTRY:
        raise ProfileError(
            f"network: unknown profile {name!r}; allowed: {', '.join(profile_names())}"
        )
    cc = DEFAULT_CONGESTION_CONTROL if congestion_control is None else congestion_control
    if not isinstance(cc, str) or not _CC_NAME.match(cc):
        raise ProfileError(
            f"congestion_control: {cc!r} is not a kernel algorithm name "
            "(e.g. cubic, reno, bbr; see `testbed doctor`)"
        )
    overrides: dict[str, Any] = {
        "delay_ms": delay_ms,
        "rate_kbit": rate_kbit,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        "queue_bytes": queue_bytes,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    base = _REGISTRY[name]
    if base is None:
        if given:
            field = next(iter(given))
            shaped = [p for p, link in _REGISTRY.items() if link is not None]
            raise ProfileError(
                f"{field}: the {name} profile has no link to shape; "
                f"allowed only with: {', '.join(shaped)}"
            )
        return NetworkProfile(name=name, link=None, congestion_control=cc)
    if base.trace_driven:
        if "rate_kbit" in given:
            untraced = [p for p, link in _REGISTRY.items() if link and not link.trace_driven]
            raise ProfileError(
                f"rate_kbit: profile {name!r} takes its rate from its traces; "
                f"rate_kbit is allowed only with: {', '.join(untraced)}"
            )
        catalogue = trace_catalogue()
        for trace in (base.up_trace, base.down_trace):
            if trace not in catalogue:
                raise ProfileError(
                    f"network: profile {name!r} needs trace {trace!r}, which is missing "
                    "from the trace folder (see `testbed traces list`)"
                )
    link = replace(base, **given)  # __post_init__ validates the overrides
    return NetworkProfile(name=name, link=link, congestion_control=cc)
