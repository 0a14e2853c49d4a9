"""Leaf qdiscs pyroute2 does not know by name: ``pie`` and ``pfifo_head_drop``.

The netem backend holds a queue other than tbf's own fifo in a qdisc under tbf
(``testbed.links.netem_plan.DirectionPlan.leaf_params``). pyroute2 encodes ``codel``
and ``fq_codel`` itself; :func:`install` adds the two it lacks to its plugins
(idempotent), from the kernel's attributes (include/uapi/linux/pkt_sched.h):

- ``pie``: ``TCA_PIE_TARGET`` (target queueing delay, us), ``TCA_PIE_LIMIT`` (packets),
  ``TCA_PIE_TUPDATE`` (how often the drop probability is recomputed, us);
- ``pfifo_head_drop``: ``struct tc_fifo_qopt { __u32 limit; }`` in packets, as
  ``pfifo`` (when full it drops the oldest packet, not the arriving one).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl import TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo

PIE_SETTINGS = {"target": "TCA_PIE_TARGET", "limit": "TCA_PIE_LIMIT",
                "tupdate": "TCA_PIE_TUPDATE"}


class PieOptions(nla):  # type: ignore[misc]  # pyroute2's netlink classes are untyped
    nla_map = (
        ("TCA_PIE_UNSPEC", "none"),
        ("TCA_PIE_TARGET", "uint32"),
        ("TCA_PIE_LIMIT", "uint32"),
        ("TCA_PIE_TUPDATE", "uint32"),
        ("TCA_PIE_ALPHA", "uint32"),
        ("TCA_PIE_BETA", "uint32"),
        ("TCA_PIE_ECN", "uint32"),
        ("TCA_PIE_BYTEMODE", "uint32"),
        ("TCA_PIE_DQ_RATE_ESTIMATOR", "uint32"),
    )


def pie_parameters(kwarg: dict[str, Any]) -> dict[str, Any]:
    """``pie`` options from ``target`` (us), ``limit`` (packets), ``tupdate`` (us)."""
    return {"attrs": [[attr, int(kwarg[key])] for key, attr in PIE_SETTINGS.items()
                      if key in kwarg]}


PIE = SimpleNamespace(parent=TC_H_ROOT, get_parameters=pie_parameters, options=PieOptions)
PFIFO_HEAD_DROP = sched_pfifo


def install() -> None:
    """Teach pyroute2 the two kinds (idempotent)."""
    plugins.setdefault("pie", PIE)
    plugins.setdefault("pfifo_head_drop", PFIFO_HEAD_DROP)
