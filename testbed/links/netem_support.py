"""What the netem backend refuses, before anything is created.

A network netem would run otherwise than defined is refused with one line
(``testbed.links.backends`` asks here before it opens a backend, and ``auto`` passes
netem over for such a network): a field netem cannot express (``netem_plan.unsupported``:
a delay trace, a byte bound on CoDel) or packet logs is the user's choice (UserError);
CoDel on a kernel without sch_codel is the host's lack (HostError).
"""

from __future__ import annotations

import functools

from testbed.errors import HostError, UserError
from testbed.links.linkspec import NetworkProfile
from testbed.links.netem import probe_qdisc
from testbed.links.netem_plan import unsupported, uses_codel


def check_supported(profile: NetworkProfile, *, packet_log: bool = False) -> None:
    """Refuse, before anything exists, a network netem would run otherwise than defined:
    a field it cannot express (UserError) or CoDel without sch_codel here (HostError)."""
    reason = support_problem(profile, packet_log=packet_log)
    if reason is None:
        return
    if "sch_codel" in reason:
        raise HostError(reason)
    raise UserError(reason)


def support_problem(profile: NetworkProfile, *, packet_log: bool = False) -> str | None:
    """Why this backend cannot run PROFILE as defined here (one line), or None."""
    if packet_log:
        return ("options.link_log: the netem backend keeps no packet log; use backend "
                "userspace")
    reason = unsupported(profile)
    if reason is not None:
        return reason
    if uses_codel(profile):
        ok, why = codel_available()
        if not ok:
            return (f"network {profile.name}: queue.kind codel needs the kernel's sch_codel, "
                    f"which this host lacks ({why}); use backend userspace")
    return None


@functools.lru_cache(maxsize=1)
def codel_available() -> tuple[bool, str]:
    """Functional probe (once per process): can a codel qdisc be added here?"""
    return probe_qdisc("codel", {"cdl_limit": 1000})
