"""``python -m testbed.tools.in_netns NETNS PROGRAM [ARGS...]``: enter a network
namespace the testbed created, then become PROGRAM (exec, same pid).

Used by `testbed bench cluster` to start a scheduler, workers and clients on the
"hosts" of its lab (``testbed.tools.lab_net``). It enters the namespace while this
process has one thread, then replaces itself with PROGRAM (looked up on PATH when it
has no slash). A namespace that cannot be entered is one line and exit status 3.
"""

from __future__ import annotations

import os
import shutil
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m testbed.tools.in_netns NETNS PROGRAM [ARGS...]",
              file=sys.stderr)
        return 2
    netns, program, *args = argv
    from pyroute2 import netns as pr_netns

    try:
        pr_netns.setns(netns, flags=0)
    except OSError as exc:
        print(f"in_netns: cannot enter {netns!r}: {exc} (errno {exc.errno})", file=sys.stderr)
        return 3
    path = program if "/" in program else shutil.which(program)
    if path is None:
        print(f"in_netns: {program!r} is not on PATH", file=sys.stderr)
        return 2
    os.execv(path, [program, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
