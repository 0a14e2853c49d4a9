"""The netem backend's probes: scratch namespaces with a veth pair and a qdisc.

Each probe builds what it tries in a namespace of its own, recorded in a scratch ledger
before it exists and removed on the way out (``testbed clean`` removes it after a
crash), and reports the kernel's errno when refused. ``testbed doctor``, ``--backend
auto`` and the backend's own checks (``netem_support``) use them.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from functools import partial
from typing import Any

from testbed.host.kernel import kernel_call
from testbed.host.ledger import scratch_ledger
from testbed.links.backend import ProbeResult
from testbed.links.netem_plan import tbf_params


def _errno_text(exc: BaseException) -> str:
    code = getattr(exc, "errno", None) or getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return f"[Errno {code} {errno.errorcode.get(code, '?')}] {os.strerror(code)}"
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def scratch_veth(prefix: str | None = None) -> Iterator[tuple[str, str, Any]]:
    """A throwaway namespace with a veth pair (up), recorded in a scratch ledger.

    Yields (namespace, name of one veth end, an open pyroute2 IPRoute inside the
    namespace); everything is removed on exit. Raises KernelError if the kernel refuses.
    """
    from pyroute2 import IPRoute

    from testbed.host import kernel

    with scratch_ledger(prefix=prefix) as ledger:
        tag = ledger.prefix
        name = f"{tag}ns"
        ledger.record_netns(name)
        kernel.create_netns(name)
        ipr = kernel_call(f"open netlink in {name}", lambda: IPRoute(netns=name))
        try:
            ledger.record_link(f"{tag}a", name)
            kernel_call(f"add veth {tag}a in {name}",
                    lambda: ipr.link("add", ifname=f"{tag}a", kind="veth", peer=f"{tag}b"))
            for end in (f"{tag}a", f"{tag}b"):
                index = kernel_call(f"lookup {end}", partial(ipr.link_lookup, ifname=end))[0]
                kernel_call(f"set {end} up", partial(ipr.link, "set", index=index, state="up"))
            yield name, f"{tag}a", ipr
        finally:
            ipr.close()


def probe_qdisc(kind: str, params: dict[str, Any], *, prefix: str | None = None,
                ) -> tuple[bool, str]:
    """Try to attach qdisc ``kind`` to a veth in a scratch namespace; (works, why)."""
    if os.geteuid() != 0:
        return False, f"not probed: {kind} needs root (run `testbed doctor` as root)"
    stage = "scratch namespace"
    try:
        with scratch_veth(prefix) as (name, ifname, ipr):
            index = ipr.link_lookup(ifname=ifname)[0]
            stage = f"{kind} qdisc"
            kernel_call(f"add {kind} qdisc",
                    lambda: ipr.tc("add", kind, index, handle="1:0", **params))
            return True, f"{kind} qdisc attached to a veth in scratch namespace {name}"
    except (OSError, ValueError) as exc:
        reason = _errno_text(exc)
        hint = ""
        if stage != "scratch namespace" and getattr(exc, "errno", None) == errno.ENOENT:
            hint = f" (the kernel has no sch_{kind})"
        return False, f"adding {stage} failed: {reason}{hint}"


def netem_available(prefix: str | None = None) -> tuple[bool, str]:
    """Functional probe: can a netem qdisc be added here? (answer, errno-bearing reason)."""
    return probe_qdisc("netem", {"delay": 20_000, "loss": 0, "limit": 1000}, prefix=prefix)


def probes() -> list[ProbeResult]:
    """veth pairs, netem and tbf, each tried in a scratch namespace (backend rule 4)."""
    if os.geteuid() != 0:
        return [ProbeResult(name, False, "not probed: needs root (run `testbed doctor` as root)")
                for name in ("veth", "netem", "tbf")]
    try:
        with scratch_veth() as (name, ifname, _ipr):
            veth = ProbeResult("veth", True, f"veth pair {ifname} up in scratch namespace "
                               f"{name} (removed)")
    except OSError as exc:
        veth = ProbeResult("veth", False, f"scratch namespace with a veth pair failed: "
                           f"{_errno_text(exc)}")
    ok, detail = netem_available()
    tbf_ok, tbf_detail = probe_qdisc("tbf", tbf_params(1000.0, limit_bytes=150_000))
    return [veth, ProbeResult("netem", ok, detail), ProbeResult("tbf", tbf_ok, tbf_detail)]
