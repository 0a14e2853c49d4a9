"""Backend probe verdicts kept for this boot and this set of kernel modules.

A backend's probes create scratch namespaces, devices and qdiscs (0.1-1 s); every
``testbed exec``, ``shell`` and ``run`` would pay that before its first packet. Rules:

1. A verdict (works, detail) is kept in ``<state dir>/probes.json`` under a key made
   of the kernel's boot id and a digest of ``/proc/modules``: after a reboot, or once a
   module was loaded or removed (``modprobe sch_netem``, ``modprobe tun``), the probes
   run again.
2. Only root in the initial user namespace keeps verdicts (the state directory is
   root's, ``testbed.host.ledger.STATE_DIR``); other callers always probe.
3. A working backend's verdict is kept at once; a failure only once the same failure
   (same detail) was found twice in a row, so a passing hiccup (a busy host, a race with
   another run) is probed again rather than kept for the whole boot.
4. ``TESTBED_FRESH_PROBES=1`` probes and neither reads nor writes the file (tests that
   simulate a missing feature in their own process set it); ``testbed doctor`` runs the
   probes themselves and never reads this.
5. A file that cannot be read or parsed is ignored and rewritten; writes are atomic.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from testbed.host.ledger import STATE_DIR
from testbed.host.userns import in_user_namespace

FRESH_ENV = "TESTBED_FRESH_PROBES"
FILE_NAME = "probes.json"


def kernel_key() -> str | None:
    """Boot id + digest of the loaded modules (rule 1); None where it cannot be read."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    try:
        modules = Path("/proc/modules").read_bytes()
    except FileNotFoundError:
        modules = b""  # a kernel without loadable modules: nothing can change until reboot
    except OSError:
        return None
    names = b"\n".join(sorted(line.split(b" ", 1)[0] for line in modules.splitlines()))
    return f"{boot}/{hashlib.sha256(names).hexdigest()[:16]}"


def cached_probe(name: str, probe: Callable[[], tuple[bool, str]], *,
                 state_dir: Path = STATE_DIR) -> tuple[bool, str]:
    """PROBE's verdict for backend NAME, from the file when it still holds (rules 1-4)."""
    key = kernel_key()
    if key is None or os.geteuid() != 0 or in_user_namespace() or os.environ.get(FRESH_ENV):
        return probe()
    path = state_dir / FILE_NAME
    entry = f"{key}/{name}"
    known: dict[str, list[object]] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(path.read_text())
        if isinstance(loaded, dict):
            known = {k: v for k, v in loaded.items() if k.startswith(key)}
    hit = known.get(entry)
    seen = 0
    if isinstance(hit, list) and len(hit) == 3:
        if hit[0] is True or (hit[0] is False and isinstance(hit[2], int) and hit[2] >= 2):
            return bool(hit[0]), f"{hit[1]} (probed earlier this boot)"
        seen = int(hit[2]) if isinstance(hit[2], int) else 0
    works, detail = probe()
    same = isinstance(hit, list) and len(hit) == 3 and hit[:2] == [works, detail]
    known[entry] = [works, detail, seen + 1 if same else 1]
    with contextlib.suppress(OSError):
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(path)
    return works, detail
