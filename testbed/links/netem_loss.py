"""netem's loss models over netlink: the ``TCA_NETEM_LOSS`` attribute pyroute2 lacks.

pyroute2's netem plugin encodes delay, IID loss, correlation, reorder, corruption and
rate, but maps ``TCA_NETEM_LOSS`` (the nested attribute of ``tc ... loss gemodel``) to
nothing. :func:`install` replaces the plugin for kind ``netem`` with this module, a
superset: the same parameters, plus ``gemodel={"p", "r", "h", "k1"}`` (u32
probabilities, ``testbed.links.netem_plan.gemodel_params``) sent as
``TCA_NETEM_LOSS { NETEM_LOSS_GE { p, r, h, k1 } }`` (include/uapi/linux/pkt_sched.h);
netem's own IID ``loss`` field is then 0. Decoding qdisc dumps keeps working (the
options class has pyroute2's fields and attributes, plus the loss models).
"""

from __future__ import annotations

import sys
from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.tcmsg import plugins, sched_netem

parent = sched_netem.parent


def get_parameters(kwarg: dict[str, Any]) -> dict[str, Any]:
    gemodel = kwarg.pop("gemodel", None)
    opts: dict[str, Any] = sched_netem.get_parameters(kwarg)
    if gemodel is not None:
        opts["loss"] = 0
        opts["attrs"].append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", {
            "p": int(gemodel["p"]), "r": int(gemodel["r"]), "h": int(gemodel["h"]),
            "k1": int(gemodel["k1"])}]]}])
    return opts


class options(nla):  # type: ignore[misc]  # pyroute2's naming
    """pyroute2's netem options with ``TCA_NETEM_LOSS`` decoded. Not a subclass of
    pyroute2's class: pyroute2 caches the compiled attribute map on the class it first
    used, and a subclass would inherit that cache (and lose the loss attribute)."""

    fields = sched_netem.options.fields
    nla_map = tuple(("TCA_NETEM_LOSS", "netem_loss") if name == "TCA_NETEM_LOSS"
                    else (name, kind) for name, kind in sched_netem.options.nla_map)
    netem_corr = sched_netem.options.netem_corr
    netem_reorder = sched_netem.options.netem_reorder
    netem_corrupt = sched_netem.options.netem_corrupt
    netem_rate = sched_netem.options.netem_rate

    class netem_loss(nla):  # type: ignore[misc]
        nla_map = (
            ("NETEM_LOSS_UNSPEC", "none"),
            ("NETEM_LOSS_GI", "gimodel"),
            ("NETEM_LOSS_GE", "gemodel"),
        )

        class gimodel(nla):  # type: ignore[misc]
            fields = (("p13", "I"), ("p31", "I"), ("p32", "I"), ("p14", "I"), ("p23", "I"))

        class gemodel(nla):  # type: ignore[misc]
            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


def install() -> None:
    """Use this module as pyroute2's netem plugin (idempotent)."""
    plugins["netem"] = sys.modules[__name__]
