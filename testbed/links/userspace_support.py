"""What the userspace backend refuses, before anything is created.

Its emulator runs the link model (``testbed.links.model``), which has drop-tail,
drop-head and CoDel queues; the kernel's PIE and fq_codel are the netem backend's. A
network with a queue the model does not have is refused with one line naming the
field (UserError), and ``auto`` passes userspace over for it.
"""

from __future__ import annotations

from testbed.errors import UserError
from testbed.links.linkspec import NetworkProfile
from testbed.links.model import USERSPACE_QUEUES


def support_problem(profile: NetworkProfile, *, packet_log: bool = False) -> str | None:
    """Why the userspace backend cannot run PROFILE as defined (one line), or None."""
    for selector, link in [("", profile.link), *profile.hosts]:
        if link is None:
            continue
        where = f"network {profile.name}" + (f", host {selector}" if selector else "")
        for side in link.sides:
            kind = side.queue.kind
            if kind not in USERSPACE_QUEUES:
                own = getattr(link, f"{side.direction}_queue") is not None
                field = f"{side.direction}_queue" if own else "queue"
                return (f"{where}: {field}.kind {kind}: the userspace backend does not "
                        f"model {kind} (it has {', '.join(USERSPACE_QUEUES)}); use backend "
                        "netem, which runs the kernel's")
    return None


def check_supported(profile: NetworkProfile, *, packet_log: bool = False) -> None:
    reason = support_problem(profile, packet_log=packet_log)
    if reason is not None:
        raise UserError(reason)
