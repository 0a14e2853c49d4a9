"""Failures injected into the testbed's own child processes, for the containment tests.

Python imports ``sitecustomize`` at every interpreter start; a test puts this directory
on ``PYTHONPATH`` and describes the faults in ``PF_TEST_HOOKS`` (JSON), so the real node
and emulator processes that the testbed starts misbehave for real (nothing in the
testbed is replaced). Without ``PF_TEST_HOOKS`` this file does nothing.

``PF_TEST_HOOKS`` = ``{"dir": STATE_DIR, FAULT: {...}, ...}``; each fault fires for the
first ``times`` processes it matches (counted in STATE_DIR under a lock, across
processes), and logs each firing as a line of ``STATE_DIR/FAULT.log``. A node forked by a
zygote (nodes/zygote.py) meets its faults when the zygote's child calls the node's main:

- ``node_hang`` ``{"agent": "a0", "times": N}``: that node sleeps before it opens its
  control socket, until it is killed (a node that never starts).
- ``pin_control_dir`` ``{"agent": "a0", "times": N}``: that node mounts a tmpfs inside
  its team's control-socket directory, so removing the directory fails (EBUSY), as a
  teardown error does; the log line is the mount point (the test unmounts it).
- ``emulator_exit`` ``{"after_s": S, "times": N}``: a link emulator process exits with
  status 70 S seconds after it started (the emulator dies mid-run); with
  ``"after_file": NAME``, S seconds after STATE_DIR/NAME appears (a test writes it when
  an episode starts, so the emulator dies under that episode however long the team took
  to start).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time


def _fire(state: str, fault: str, times: int, note: str) -> bool:
    """Count one match of ``fault``; True while it has fired fewer than ``times``."""
    with open(os.path.join(state, f"{fault}.count"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        seen = len(f.read().splitlines())
        if seen >= times:
            return False
        f.write(f"{os.getpid()}\n")
    with open(os.path.join(state, f"{fault}.log"), "a") as log:
        log.write(note + "\n")
    return True


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _node_faults(hooks: dict, state: str, argv: list[str]) -> None:  # type: ignore[type-arg]
    """The node faults, for a node whose command line (after ``-m nodes``) is ARGV."""
    control = _arg(argv, "--control") or ""
    agent = os.path.basename(control).removesuffix(".sock")
    hang = hooks.get("node_hang")
    if hang and hang["agent"] == agent and _fire(state, "node_hang", hang["times"],
                                                 control):
        while True:
            time.sleep(3600)
    pin = hooks.get("pin_control_dir")
    if pin and pin["agent"] == agent:
        point = os.path.join(os.path.dirname(control), "pin")
        if _fire(state, "pin_control_dir", pin["times"], point):
            os.mkdir(point)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", point],
                           check=True)


def _fault_forked_nodes(hooks: dict, state: str) -> None:  # type: ignore[type-arg]
    """In a node zygote (nodes/zygote.py) no node starts an interpreter: each forked
    child calls ``nodes.__main__.main(argv)``, so the faults go in front of it."""
    import nodes.__main__ as node_main

    plain = node_main.main

    def main(argv: list[str] | None = None) -> int:
        _node_faults(hooks, state, list(argv or []))
        return plain(argv)

    node_main.main = main  # type: ignore[assignment]


def _main() -> None:
    raw = os.environ.get("PF_TEST_HOOKS")
    if not raw:
        return
    hooks = json.loads(raw)
    state = hooks["dir"]
    argv = list(getattr(sys, "orig_argv", []))
    module = _arg(argv, "-m")
    if module == "nodes":
        _node_faults(hooks, state, argv)
    elif module == "nodes.zygote":
        _fault_forked_nodes(hooks, state)
    elif module == "testbed.links.emulator":
        crash = hooks.get("emulator_exit")
        if crash and _fire(state, "emulator_exit", crash["times"], str(os.getpid())):
            def exit_later() -> None:
                if crash.get("after_file"):
                    while not os.path.exists(os.path.join(state, crash["after_file"])):
                        time.sleep(0.02)
                time.sleep(float(crash.get("after_s", 0.0)))
                os._exit(70)

            threading.Thread(target=exit_later, daemon=True).start()


_main()
