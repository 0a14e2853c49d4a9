"""netem counters come from each direction's root qdisc, once (pure: pyroute2-shaped
messages built by hand)."""

from __future__ import annotations

from typing import Any

from testbed.links.netem_plan import TC_H_ROOT, root_counters


class Msg(dict[str, Any]):
    """A pyroute2 tcmsg stand-in: fields by key, attributes by get_attr."""

    def __init__(self, parent: int, stats: dict[str, int]) -> None:
        super().__init__(parent=parent)
        self.stats = stats

    def get_attr(self, name: str) -> dict[str, int] | None:
        return self.stats if name == "TCA_STATS" else None


def test_root_qdisc_alone_counts_and_bytes_are_ip_bytes() -> None:
    # the kernel counts a tbf drop in tbf and again in its netem parent: only the root
    netem = Msg(TC_H_ROOT, {"packets": 10, "bytes": 10 * 1514, "drop": 3})
    tbf = Msg(0x10001, {"packets": 10, "bytes": 10 * 1514, "drop": 3})
    assert root_counters([tbf, netem]) == {"packets": 10, "bytes": 15_000, "drops": 3}


def test_no_root_qdisc_counts_nothing() -> None:
    assert root_counters([]) == {"packets": 0, "bytes": 0, "drops": 0}
