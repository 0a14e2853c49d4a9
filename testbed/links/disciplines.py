"""Loss models and CoDel for the link model (pure: no I/O, time is an input).

Rules:

- :class:`GilbertElliott` steps a two-state chain once per packet: the packet meets the
  current state (lost with ``loss_good_pct`` in good, ``loss_bad_pct`` in bad), then the
  chain moves good -> bad with ``p`` or bad -> good with ``r`` (netem's ``gemodel``
  draws in the same order). It starts in the good state; draws come from the link's
  seeded RNG.
- :class:`Codel` is the controlled-delay AQM of RFC 8289 (the pseudocode Mahimahi's
  ``codel`` queue follows), run at dequeue: the link model asks it, each time a packet
  is about to start leaving the queue at a delivery opportunity, whether to drop that
  packet instead (``sojourn`` = opportunity time - arrival time). Drops are never on
  arrival, except the queue bounds' own tail drops.
"""

from __future__ import annotations

import math
import random

PACKET_BYTES = 1500


class GilbertElliott:
    """Per-packet Gilbert-Elliott loss (module rules)."""

    def __init__(self, p: float, r: float, loss_good_pct: float, loss_bad_pct: float,
                 rng: random.Random) -> None:
        self.p = p
        self.r = r
        self.good = loss_good_pct / 100.0
        self.bad = loss_bad_pct / 100.0
        self.rng = rng
        self.in_bad = False

    def lose(self) -> bool:
        """Whether the next packet is lost; steps the chain."""
        rand = self.rng.random
        if self.in_bad:
            lost = self.bad >= 1.0 or (self.bad > 0.0 and rand() < self.bad)
            if rand() < self.r:
                self.in_bad = False
        else:
            lost = self.good >= 1.0 or (self.good > 0.0 and rand() < self.good)
            if rand() < self.p:
                self.in_bad = True
        return lost


class Codel:
    """RFC 8289 state; the queue calls :meth:`ok_to_drop` and :meth:`on_dequeue`."""

    def __init__(self, target_ms: float, interval_ms: float,
                 max_packet_bytes: int = PACKET_BYTES) -> None:
        self.target_ms = target_ms
        self.interval_ms = interval_ms
        self.max_packet = max_packet_bytes
        self.first_above_ms: float | None = None
        self.drop_next_ms = 0.0
        self.count = 0
        self.lastcount = 0
        self.dropping = False
        self.drops = 0

    def control_law(self, t_ms: float) -> float:
        return t_ms + self.interval_ms / math.sqrt(self.count)

    def ok_to_drop(self, sojourn_ms: float, now_ms: float, bytes_behind: int) -> bool:
        """RFC 8289 ``dodequeue``'s verdict for the packet at the head (updates state)."""
        if sojourn_ms < self.target_ms or bytes_behind <= self.max_packet:
            self.first_above_ms = None
            return False
        if self.first_above_ms is None:
            self.first_above_ms = now_ms + self.interval_ms
            return False
        return now_ms >= self.first_above_ms

    def queue_empty(self) -> None:
        """Nothing left to dequeue (RFC 8289: first_above_time = 0, leave dropping)."""
        self.first_above_ms = None
        self.dropping = False

    def enter_dropping(self, now_ms: float) -> None:
        """The first drop of a dropping state (RFC 8289 ``dequeue``, else branch)."""
        self.dropping = True
        delta = self.count - self.lastcount
        recent = now_ms - self.drop_next_ms < 16 * self.interval_ms
        self.count = delta if delta > 1 and recent else 1
        self.drop_next_ms = self.control_law(now_ms)
        self.lastcount = self.count
