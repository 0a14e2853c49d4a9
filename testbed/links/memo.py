"""Values derived from a link's large, immutable parts, computed once per process.

A team's links are rebuilt for every team: with 16 lanes, a campaign builds the same
trace's stamp tuple, its wire bytes and, in the shared emulator, its opportunity
schedule 16 times or more (about 0.1 s of CPU per AT&T team; docs/benchmarks.md, "A
team's start"). These caches keep the last few.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Obj = TypeVar("Obj")
V = TypeVar("V")

ENTRIES = 16
"""Distinct traces x directions a campaign replays at once is small (3 LTE traces x 2);
a full cache is emptied rather than ordered."""


class ByIdentity(Generic[Obj, V]):
    """FN(obj), found by the object's identity: hashing a 300,000-stamp tuple costs as
    much as what it would find. Each entry holds its object, so its id cannot be reused
    while the entry stands. For objects nobody changes (read-only arrays, tuples)."""

    def __init__(self, fn: Callable[[Obj], V], entries: int = ENTRIES) -> None:
        self._fn = fn
        self._entries = entries
        self._found: dict[int, tuple[Obj, V]] = {}

    def __call__(self, obj: Obj) -> V:
        hit = self._found.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = self._fn(obj)
        if len(self._found) >= self._entries:
            self._found.clear()
        self._found[id(obj)] = (obj, value)
        return value


class ByKey(Generic[K, V]):
    """Values by hashable key (e.g. the bytes of a stamp list that came over a socket:
    hashing bytes is cheap next to decoding them), bounded like :class:`ByIdentity`."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._entries = entries
        self._found: dict[K, V] = {}

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of KEY, made by MAKE() the first time."""
        if key in self._found:
            return self._found[key]
        value = make()
        if len(self._found) >= self._entries:
            self._found.clear()
        self._found[key] = value
        return value
