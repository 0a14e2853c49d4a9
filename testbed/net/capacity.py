"""How many hosts one network may have on this machine (``testbed exec --hosts``).

The link emulator waits on its fds with epoll (``testbed.links.emulator``), so neither
it nor the controller has a fixed host limit; what bounds a network is the controller's
fd limit and the memory of one launcher process per host. Both are read from this
machine when asked, with the per-host costs measured with ``testbed exec fixed --hosts
200 -- sleep 8``: 777 fds in the controller (3.9 per host) and 980 MB
less available memory (4.9 MB per host).
"""

from __future__ import annotations

from testbed.links.emulator import FIXED_FDS, fd_limit
from testbed.links.emulator_group import CONTROL_MAX_ITEMS

#: fds the controller holds per host: the TUN device, the launcher's pipes, its pidfd
FDS_PER_HOST = 4
#: memory one host takes (its launcher process and namespace), with a margin
MEMORY_PER_HOST_BYTES = 6 * 1024 * 1024


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_limit(hosts: int) -> tuple[int, str]:
    """The most hosts a network may have here now, and what sets that number. The soft
    fd limit is raised as far as HOSTS need (and the hard limit allows), so programs
    in a small network keep the limit they would have had."""
    fds = fd_limit(FIXED_FDS + hosts * FDS_PER_HOST)
    if fds < FIXED_FDS + hosts * FDS_PER_HOST:
        fds = fd_limit(None)  # as high as it goes, for the number the error names
    limits = [((fds - FIXED_FDS) // FDS_PER_HOST,
               f"the fd limit {fds} (ulimit -n; {FDS_PER_HOST} per host)"),
              (CONTROL_MAX_ITEMS, "the emulator's control messages")]
    memory = available_memory_bytes()
    if memory is not None:
        limits.append((memory // MEMORY_PER_HOST_BYTES,
                       f"{memory // 2**20} MiB of available memory "
                       f"({MEMORY_PER_HOST_BYTES // 2**20} MiB per host)"))
    count, reason = min(limits)
    return max(count, 0), reason
