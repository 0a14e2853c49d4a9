"""Privileges and host features of tests: run a function as the unprivileged user
``nobody`` (for tests run as root); skip unless the kernel runs netem."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

NOBODY = 65534
_TUN_NODE = "mount -t tmpfs -o mode=0755 tmpfs /dev/net && mknod -m 0666 /dev/net/tun c 10 200"
TUN_0666 = (f"{_TUN_NODE} "
            f"&& exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups \"$@\"")
"""``sh -c`` script, run as root inside ``unshare --mount --propagation private``: a
0666 TUN node over /dev/net (this host's own is 0600), then its arguments as nobody."""
TUN_0666_ROOT = f'{_TUN_NODE} && exec "$@"'
"""The same node, then its arguments still as root (a daemon whose children, such as
a Slurm compute node's jobs, may open TUN devices as users, as on Debian)."""


def as_nobody(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child that dropped to uid/gid 65534; its JSON-able result.

    The child exits with ``os._exit`` (no cleanup handlers of the parent run twice).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write_fd, json.dumps(fn()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, "the unprivileged child failed"
    return json.loads(payload)


def require_netem() -> None:
    """Skip unless root on a kernel that runs netem (call it outside trio, e.g. in a
    fixture, so the reason survives)."""
    import pytest

    from testbed.links.netem import netem_available

    if os.geteuid() != 0:
        pytest.skip("netem backend needs root")
    ok, why = netem_available()
    if not ok:
        pytest.skip(f"netem unavailable on this kernel: {why}")
