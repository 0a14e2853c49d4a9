"""What the sim backend runs, checked before anything runs (one line each).

1. Only ``episodes`` campaigns: single-action trials, live workflows and command
   workloads (your own programs) need real processes.
2. No packet logs (``options.link_log``): the model keeps none yet.
3. Every link's queue is one the link model runs (``testbed.links.model``:
   droptail, drophead, codel); the kernel's other qdiscs are netem's alone.
"""

from __future__ import annotations

from testbed.campaign.model import Campaign, CampaignError
from testbed.links.model import USERSPACE_QUEUES


def check_campaign(campaign: Campaign) -> None:
    """The module's rules; a CampaignError naming the field otherwise."""
    if campaign.command is not None:
        raise CampaignError("backend sim: a command workload runs your own programs, which "
                            "need real hosts; use backend auto")
    if campaign.kind != "episodes":
        raise CampaignError(f"backend sim: campaign kind {campaign.kind!r} is not simulated "
                            "(only episode campaigns are); use backend auto")
    if campaign.options.link_log:
        raise CampaignError("options.link_log: the sim backend writes no packet logs; drop "
                            "link_log or use backend userspace")
    for name in campaign.network_names():
        profile = campaign.network_profile(name)
        for selector, link in [("", profile.link), *profile.hosts]:
            if link is None:
                continue
            for side in link.sides:
                if side.queue.kind not in USERSPACE_QUEUES:
                    where = f"network {name}" + (f", host {selector}" if selector else "")
                    raise CampaignError(
                        f"backend sim: {where}: queue kind {side.queue.kind} is not in the "
                        f"link model (it has {', '.join(USERSPACE_QUEUES)}); use backend "
                        "netem")
