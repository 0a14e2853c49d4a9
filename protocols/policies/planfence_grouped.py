"""PlanFence with grouped queries (beyond the paper): same scope D(a), one request per owner.

On the action path: one concurrent ``heads`` request per distinct owner of the declared
keys (carrying all of that owner's declared keys), fetches of changed heads, and the
same after the single replan. Off the path: nothing.
"""

from __future__ import annotations

from protocols.policies.planfence import PlanFence
from protocols.policies.registry import register


@register
class PlanFenceGrouped(PlanFence):
    """On path: one owner query per owner of D(a) per pass, fetches. Off path: nothing."""

    name = "planfence_grouped"
    display_name = "PlanFence, owner-grouped"
    per_key = False
