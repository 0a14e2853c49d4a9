"""Access links and networks as plain data: :class:`LinkSpec`, :class:`NetworkProfile`.

Rules:

- a network gives every host one access link (``NetworkProfile.link``), except the
  hosts its ``hosts`` table names, which get their own (an agent by index, ``"0"``, or
  by name, ``"a0"``, or ``"central"``); a team can so mix carriers or put the central
  service on a wired link;
- traffic from host A to host B crosses A's uplink then B's downlink; each crossing
  adds that link's one-way ``delay_ms``, so a request/response between A and B pays
  2 x (A's delay + B's delay) of propagation (4 x delay_ms when both links are alike);
- a link is shaped by a trace pair (up, down; Mahimahi files), or by a fixed rate per
  direction (``rate_kbit``, or ``up_rate_kbit`` / ``down_rate_kbit``), or only delayed;
  a ``delay_trace`` makes the delay a step function of time;
- each direction has a queue in front of the bottleneck: drop-tail bounded by
  ``queue_packets`` and, optionally, ``queue_bytes``, or CoDel (``queue_kind = "codel"``
  with ``codel_target_ms`` / ``codel_interval_ms``, as Mahimahi's) under the same bounds;
- released packets are lost independently (``loss_pct``) or by a Gilbert-Elliott
  two-state chain (``gilbert``), never both;
- ``trace_offset_s`` is added to the cell's trace offset for this link, and an offset
  past a trace's end is refused unless ``trace_wrap`` (then replay wraps, as it always
  does while running);
- ``link is None`` is loopback: no namespaces, no shaping, no ``hosts``.

Nothing here touches the kernel or reads a file; ``testbed.links.netdef`` builds these
from campaign tables (and checks the files), the backends read them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from testbed.errors import UserError

DEFAULT_DELAY_MS = 20.0
DEFAULT_QUEUE_PACKETS = 1000
"""Drop-tail bound per direction; like Linux's default txqueuelen (1.5 MB of full packets)."""
DEFAULT_CONGESTION_CONTROL = "cubic"
MIN_QUEUE_BYTES = 1500  # one full-size packet must fit, or the link could carry nothing
QUEUE_KINDS = ("droptail", "codel")
CODEL_TARGET_MS = 5.0
CODEL_INTERVAL_MS = 100.0
CENTRAL_HOST = "central"
"""The host name of the central service (``testbed.net.plan`` names it so)."""

T = TypeVar("T")
_CC_NAME = re.compile(r"^[a-z0-9_]{1,15}$")


class ProfileError(UserError):
    """Bad profile input from the user; the message names the field and allowed values."""


def check_number(field: str, value: float, *, low: float, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    """A finite number in range, else a one-line ProfileError naming FIELD."""
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    if not bad:
        bad = value < low or (low_open and value == low)
        if high is not None:
            bad = bad or value > high or (high_open and value == high)
    if bad:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f" and {'<' if high_open else '<='} {high:g}"
        raise ProfileError(f"{field}: {value!r} is not allowed; use a number {lo}{hi}")


def check_congestion_control(cc: Any, field: str = "congestion_control") -> str:
    if not isinstance(cc, str) or not _CC_NAME.match(cc):
        raise ProfileError(
            f"{field}: {cc!r} is not a kernel algorithm name "
            "(e.g. cubic, reno, bbr; see `testbed doctor`)"
        )
    return cc


@dataclass(frozen=True)
class GilbertLoss:
    """Gilbert-Elliott loss: a two-state Markov chain stepped once per packet.

    ``p`` = P(good -> bad), ``r`` = P(bad -> good) (probabilities per packet); a packet
    is lost with ``loss_good_pct`` in the good state and ``loss_bad_pct`` in the bad one
    (the state it meets, before the step). netem's ``loss gemodel p r 1-h 1-k``.
    """

    p: float
    r: float
    loss_good_pct: float = 0.0
    loss_bad_pct: float = 100.0

    def __post_init__(self) -> None:
        check_number("loss.p", self.p, low=0.0, high=1.0, low_open=True)
        check_number("loss.r", self.r, low=0.0, high=1.0, low_open=True)
        check_number("loss.loss_good_pct", self.loss_good_pct, low=0.0, high=100.0)
        check_number("loss.loss_bad_pct", self.loss_bad_pct, low=0.0, high=100.0)

    @property
    def mean_loss_pct(self) -> float:
        """Long-run share of lost packets (stationary distribution of the chain)."""
        return (self.r * self.loss_good_pct + self.p * self.loss_bad_pct) / (self.p + self.r)

    @property
    def mean_bad_run_packets(self) -> float:
        """Mean number of consecutive packets spent in the bad state (1 / r)."""
        return 1.0 / self.r


@dataclass(frozen=True)
class LinkSpec:
    """One host's access link, both directions (see the module rules).

    Either both traces are set (trace-driven) or neither; the rates apply only without
    traces (None = no rate limit in that direction, delay only). ``delay_trace``,
    ``up_trace`` and ``down_trace`` are trace references (``testbed.links.traces``):
    shipped names or absolute paths.
    """

    up_trace: str | None = None
    down_trace: str | None = None
    rate_kbit: float | None = None
    delay_ms: float = DEFAULT_DELAY_MS
    loss_pct: float = 0.0
    queue_packets: int = DEFAULT_QUEUE_PACKETS
    queue_bytes: int | None = None
    up_rate_kbit: float | None = None
    down_rate_kbit: float | None = None
    delay_trace: str | None = None
    gilbert: GilbertLoss | None = None
    queue_kind: str = "droptail"
    codel_target_ms: float = CODEL_TARGET_MS
    codel_interval_ms: float = CODEL_INTERVAL_MS
    trace_offset_s: float = 0.0
    trace_wrap: bool = False

    def __post_init__(self) -> None:
        if (self.up_trace is None) != (self.down_trace is None):
            raise ProfileError("up_trace/down_trace: set both trace names or neither")
        rates = {"rate_kbit": self.rate_kbit, "up_rate_kbit": self.up_rate_kbit,
                 "down_rate_kbit": self.down_rate_kbit}
        for field, rate in rates.items():
            if rate is None:
                continue
            if self.up_trace is not None:
                raise ProfileError(
                    f"{field}: a trace-driven link takes its rate from the traces; use None"
                )
            check_number(field, rate, low=0.0, low_open=True)
        check_number("delay_ms", self.delay_ms, low=0.0, high=10_000.0)
        check_number("loss_pct", self.loss_pct, low=0.0, high=100.0, high_open=True)
        if self.gilbert is not None and self.loss_pct > 0:
            raise ProfileError("loss: give either an iid loss_pct or a gilbert model, not both")
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
        if self.queue_kind not in QUEUE_KINDS:
            raise ProfileError(f"queue_kind: {self.queue_kind!r} is not allowed; allowed: "
                               f"{', '.join(QUEUE_KINDS)}")
        check_number("codel_target_ms", self.codel_target_ms, low=0.0, high=10_000.0,
                     low_open=True)
        check_number("codel_interval_ms", self.codel_interval_ms, low=self.codel_target_ms,
                     high=100_000.0)
        check_number("trace_offset_s", self.trace_offset_s, low=0.0, high=1e6, high_open=True)
        if not isinstance(self.trace_wrap, bool):
            raise ProfileError(f"trace_wrap: {self.trace_wrap!r} is not allowed; use true "
                               "or false")

    @property
    def trace_driven(self) -> bool:
        return self.up_trace is not None

    def trace_of(self, direction: str) -> str | None:
        return self.up_trace if direction == "up" else self.down_trace

    def rate_of(self, direction: str) -> float | None:
        """The fixed rate of one direction (None: trace-driven or unlimited)."""
        own = self.up_rate_kbit if direction == "up" else self.down_rate_kbit
        return own if own is not None else self.rate_kbit

    @property
    def shaped_rate(self) -> bool:
        """Whether either direction has a fixed rate."""
        return self.rate_of("up") is not None or self.rate_of("down") is not None

    def with_overrides(self, **given: Any) -> LinkSpec:
        return replace(self, **given)  # __post_init__ validates the overrides


@dataclass(frozen=True)
class NetworkProfile:
    """A named network setting; `link is None` means loopback (no namespaces, no shaping).

    ``hosts`` holds (selector, link) pairs for hosts that do not take ``link``: a
    selector is an agent index (``"0"``), an agent name or ``"central"``.
    """

    name: str
    link: LinkSpec | None
    congestion_control: str = DEFAULT_CONGESTION_CONTROL
    hosts: tuple[tuple[str, LinkSpec], ...] = ()
    description: str = ""
    #: (selector, algorithm): hosts whose TCP congestion control is not the network's.
    host_congestion_control: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.link is None and (self.hosts or self.host_congestion_control):
            raise ProfileError(f"{self.name}.hosts: an unshaped network has no links to vary")

    @property
    def base_rtt_ms(self) -> float:
        """Propagation-only round trip between two hosts on the common link."""
        return 0.0 if self.link is None else 4.0 * self.link.delay_ms

    def link_of(self, host: str, index: int) -> LinkSpec | None:
        """The access link of host HOST, the INDEX-th of the topology's hosts.

        Agents are matched by index (their position among the agents) or by name; the
        central service only by ``"central"``.
        """
        if self.link is None:
            return None
        return _select(dict(self.hosts), host, index, self.link)

    def congestion_control_of(self, host: str, index: int) -> str:
        """The TCP congestion control of host HOST (selectors as in :meth:`link_of`)."""
        return _select(dict(self.host_congestion_control), host, index,
                       self.congestion_control)

    def links_of(self, hosts: list[str] | tuple[str, ...]) -> list[LinkSpec | None]:
        return [self.link_of(h, i) for i, h in enumerate(hosts)]

    @staticmethod
    def rtt_between_ms(a: LinkSpec, b: LinkSpec) -> float:
        """Propagation-only round trip between hosts with links A and B."""
        return 2.0 * (a.delay_ms + b.delay_ms)

    def links(self) -> list[LinkSpec]:
        """Every distinct link of the network: the common one, then the hosts' own."""
        out: list[LinkSpec] = []
        for link in ([self.link] if self.link else []) + [lk for _, lk in self.hosts]:
            if link not in out:
                out.append(link)
        return out


def _select(overrides: dict[str, T], host: str, index: int, default: T) -> T:
    """HOST's entry among OVERRIDES (agents by index or name, the central service only
    by ``central``), else DEFAULT."""
    if host == CENTRAL_HOST:
        return overrides.get(CENTRAL_HOST, default)
    return overrides.get(str(index), overrides.get(host, default))
