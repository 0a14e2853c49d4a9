"""``python -m nodes --control SOCKET_PATH [--netns NAME] [--log-level LEVEL] [--plugin MODULE]``.

``--plugin`` imports a module (or a ``.py`` file) before serving, so that policies it
registers can be named in ``configure``; plugins installed under the entry-point group
``planfence_testbed.policies`` are imported too (``nodes.plugins``).

The namespace is entered before trio starts, so every socket the node opens (the
data-plane listener and all client connections) lives in that namespace. The control
socket is a filesystem Unix socket, reachable from the controller in any namespace.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

LOG_LEVELS = ("debug", "info", "warning", "error")
NETNS_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Move this process into the network namespace NAME (a name under /var/run/netns,
    as ``ip netns`` makes them, or a path), as pyroute2's ``netns.setns`` does, with one
    system call: importing pyroute2 for it cost every node about 0.27 s of CPU at start,
    40% of the start, paid again by every node of every lane (docs/benchmarks.md)."""
    import ctypes
    import os

    path = name if os.path.dirname(name) else os.path.join(NETNS_DIR, name)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes", description=__doc__)
    parser.add_argument("--control", required=True, help="Unix socket path to serve")
    parser.add_argument("--netns", default=None, help="network namespace to enter first")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument("--parent-pid", type=int, default=None, metavar="PID",
                        help="exit when this process (the controller) is gone; without it "
                             "the parent at start, which a controller killed during our "
                             "start-up no longer is")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (or a .py file) first; it may register policies")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    if args.netns:
        try:
            enter_netns(args.netns)
        except OSError as exc:
            print(f"--netns: cannot enter {args.netns!r}: {exc} (errno {exc.errno})",
                  file=sys.stderr)
            return 2
    import trio

    from nodes.plugins import PluginError, load_plugins

    try:  # the installed entry points and --plugin modules, as the controller loaded them
        load_plugins(args.plugin)
    except PluginError as exc:
        print(f"--plugin: {exc}", file=sys.stderr)
        return 2

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        # Room above the connection caps of nodes.limits for stores, logs and clients.
        wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if wanted > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

    from nodes.node import run_node

    fatal = trio.run(run_node, args.control, args.parent_pid)
    if fatal is not None:
        print(f"node ended: {fatal}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
