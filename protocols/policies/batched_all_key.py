"""Batched all-key validation: every owner's heads for all its keys, one request per owner.

On the action path: one concurrent ``heads`` request per owner in the keyspace (M, less
the executor itself if it owns keys) naming all of that owner's keys, fetches of
changed declared heads, and the same after the single replan. Only the declared keys
are compared (a wider query, not a wider D(a)). Off the path: nothing.
"""

from __future__ import annotations

from protocols.policies.per_key_all_key import PerKeyAllKey
from protocols.policies.registry import register


@register
class BatchedAllKey(PerKeyAllKey):
    """On path: M per-owner queries per pass, fetches. Off path: nothing."""

    name = "batched_all_key"
    display_name = "Batched all-key validation"
    per_key = False
