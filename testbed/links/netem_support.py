"""What the netem backend refuses, before anything is created.

A network netem would run otherwise than defined is refused with one line
(``testbed.links.backends`` asks here before it opens a backend, and ``auto`` passes
netem over for such a network): a field netem cannot express (``netem_plan.unsupported``:
a delay trace, a byte bound on a queue other than drop-tail) or packet logs is the
user's choice (UserError); a queue whose qdisc this kernel lacks (``sch_codel``,
``sch_pie``, ``sch_fq_codel``, ``pfifo_head_drop``; each probed once per process) is the
host's lack (HostError).
"""

from __future__ import annotations

import functools

from testbed.errors import HostError, UserError
from testbed.links import netem_qdiscs
from testbed.links.linkspec import NetworkProfile
from testbed.links.netem_plan import qdiscs_needed, unsupported
from testbed.links.netem_probes import probe_qdisc

#: A small setting of each leaf qdisc, to probe it with.
PROBE_PARAMS = {"codel": {"cdl_limit": 1000}, "pie": {"limit": 1000},
                "fq_codel": {"fqc_limit": 1000}, "pfifo_head_drop": {"limit": 1000}}


def check_supported(profile: NetworkProfile, *, packet_log: bool = False) -> None:
    """Refuse, before anything exists, a network netem would run otherwise than defined:
    a field it cannot express (UserError) or a qdisc this kernel lacks (HostError)."""
    reason = support_problem(profile, packet_log=packet_log)
    if reason is None:
        return
    if "this host lacks" in reason:
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
    for qdisc in qdiscs_needed(profile):
        ok, why = qdisc_available(qdisc)
        if not ok:
            return (f"network {profile.name}: its queue needs the kernel's {qdisc} qdisc, "
                    f"which this host lacks ({why}); use backend userspace where it models "
                    "the queue, or a kernel with it")
    return None


@functools.lru_cache(maxsize=8)
def qdisc_available(qdisc: str) -> tuple[bool, str]:
    """Functional probe (once per process and qdisc): can QDISC be added here?"""
    netem_qdiscs.install()
    return probe_qdisc(qdisc, PROBE_PARAMS[qdisc])
