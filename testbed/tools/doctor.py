"""`testbed doctor`: functional probes of what this host can emulate.

Rules:

- Probe by doing, never by reading module lists (there is no lsmod here): create a
  scratch namespace, a veth pair, a TUN device, a netem and a tbf qdisc, and report
  what the kernel said (errno included) when it refused.
- The kernel probes are the link backends' own (``probes()`` of each backend module),
  run in scratch namespaces recorded in a ledger and removed on exit.
- Without root the kernel probes are reported as not possible, not as failures of the
  kernel; the table still shows packages and congestion controls.
- Which backend ``auto`` picks is decided by ``testbed.links.backends.auto_choice``,
  the rule every run uses.
"""

from __future__ import annotations

import errno
import importlib.metadata
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.host import kernel, userns
from testbed.host.lanes import host_summary
from testbed.host.ledger import scratch_ledger
from testbed.links import netem, userspace
from testbed.links.backends import AUTO_ORDER, auto_choice
from testbed.links.profiles import DEFAULT_CONGESTION_CONTROL

__all__ = [
    "CHECK_NAMES",
    "FATAL_CHECKS",
    "REQUIRED_PACKAGES",
    "Check",
    "auto_backend",
    "render_doctor",
    "run_doctor",
]

CHECK_NAMES = (
    "root",
    "netns",
    "veth",
    "tun",
    "netem",
    "tbf",
    "rootless",
    "python packages",
    "policy plugins",
    "congestion control",
    "backend auto",
    "host lanes",
)

#: Checks whose failure fails every campaign, whatever the backend: `testbed doctor`
#: names them on stderr and exits 3.
FATAL_CHECKS = ("policy plugins",)

REQUIRED_PACKAGES: dict[str, tuple[int, ...]] = {
    "trio": (0, 27),
    "pyroute2": (0, 9, 2),
    "msgpack": (1, 2, 1),
    "PyNaCl": (1, 6, 2),
    "cryptography": (43,),
    "numpy": (1, 26),
    "pandas": (2, 2),
    "pyarrow": (15,),
    "matplotlib": (3, 8),
    "rich": (13,),
}
"""Distribution -> minimum version (msgpack and PyNaCl minimums close security bugs)."""

CC_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
CC_DEFAULT = Path("/proc/sys/net/ipv4/tcp_congestion_control")

@dataclass(frozen=True)
class Check:
    """One probe's verdict; `detail` says what was tried and, on failure, the errno."""

    name: str
    ok: bool
    detail: str


def _errno_text(exc: OSError) -> str:
    code = exc.errno
    if code:
        return f"[Errno {code} {errno.errorcode.get(code, '?')}] {os.strerror(code)}"
    return str(exc)


def _need_root(name: str) -> Check | None:
    if os.geteuid() != 0:
        return Check(name, False, "not probed: needs root (run `testbed doctor` as root)")
    return None


def check_root() -> Check:
    euid = os.geteuid()
    if euid == 0:
        return Check("root", True, "running as root (euid 0)")
    return Check("root", False, f"euid {euid}: namespaces, TUN and qdiscs need root")


def check_netns() -> Check:
    if (skip := _need_root("netns")) is not None:
        return skip
    try:
        with scratch_ledger() as ledger:
            name = f"{ledger.prefix}-doctor"
            ledger.record_netns(name)
            kernel.create_netns(name)
            present = name in kernel.list_netns()
    except OSError as exc:
        return Check("netns", False, f"creating a scratch namespace failed: {_errno_text(exc)}")
    if not present:
        return Check("netns", False, f"namespace {name} was created but is not listed")
    return Check("netns", True, f"created and removed namespace {name}")


def backend_checks() -> list[Check]:
    """The link backends' own probes (veth, tun, netem, tbf), in CHECK_NAMES order."""
    rows = {r.name: Check(r.name, r.ok, r.detail)
            for module in (netem, userspace) for r in module.probes()}
    return [rows[name] for name in ("veth", "tun", "netem", "tbf")]


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_packages() -> Check:
    problems: list[str] = []
    found: list[str] = []
    for dist, minimum in REQUIRED_PACKAGES.items():
        want = ".".join(map(str, minimum))
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{dist} missing (need >= {want})")
            continue
        if _version_tuple(version) < minimum:
            problems.append(f"{dist} {version} < {want}")
        else:
            found.append(f"{dist} {version}")
    if problems:
        return Check("python packages", False, "; ".join(problems))
    return Check("python packages", True, ", ".join(found))


def check_plugins() -> Check:
    """Every installed policy plugin (entry-point group ``planfence_testbed.policies``)
    loads: a broken one fails every campaign, since every campaign loads them all."""
    from nodes.plugins import PluginError, check_entry_point_plugins
    from protocols.api import ENTRY_POINT_GROUP

    results = check_entry_point_plugins()
    broken = [str(r) for r in results if isinstance(r, PluginError)]
    if broken:
        return Check("policy plugins", False, "; ".join(broken) + " (every campaign fails "
                     "until it is fixed or uninstalled)")
    if not results:
        return Check("policy plugins", True, f"none installed ({ENTRY_POINT_GROUP})")
    return Check("policy plugins", True, ", ".join(
        f"{r.name} ({', '.join(r.policies) or 'no new policy'})" for r in results
        if not isinstance(r, PluginError)))


def check_congestion_control(
    available_path: Path = CC_AVAILABLE, default_path: Path = CC_DEFAULT
) -> Check:
    try:
        available = available_path.read_text().split()
        default = default_path.read_text().strip()
    except OSError as exc:
        return Check("congestion control", False, f"cannot read {available_path}: {_errno_text(exc)}")
    detail = f"available: {' '.join(available)}; host default: {default}"
    if DEFAULT_CONGESTION_CONTROL not in available:
        return Check("congestion control", False,
                     f"{detail}; profiles default to {DEFAULT_CONGESTION_CONTROL}, which is missing")
    return Check("congestion control", True,
                 f"{detail}; profiles set {DEFAULT_CONGESTION_CONTROL} per namespace")


#: Which checks each backend needs (its probes, and a namespace to run them in).
BACKEND_NEEDS = {"netem": ("netns", *netem.PROBE_NAMES),
                 "userspace": ("netns", *userspace.PROBE_NAMES)}


def auto_backend(checks: Sequence[Check]) -> str | None:
    """The backend `--backend auto` picks given these checks (the run's own rule)."""
    ok = {c.name: c.ok for c in checks}
    works = {name: all(ok.get(n, False) for n in BACKEND_NEEDS[name]) for name in AUTO_ORDER}
    return auto_choice(works)


def _check_backend(checks: Sequence[Check]) -> Check:
    choice = auto_backend(checks)
    if choice == "netem":
        return Check("backend auto", True, "netem (kernel qdiscs: netns, veth, netem, tbf work)")
    if choice == "userspace":
        netem = next((c for c in checks if c.name == "netem"), None)
        why = f"; netem unusable: {netem.detail}" if netem and not netem.ok else ""
        return Check("backend auto", True, f"userspace (TUN emulator){why}")
    return Check("backend auto", False,
                 "none: only the loopback profile can run (shaped profiles need netns + TUN or netem)")


def check_rootless() -> Check:
    """Unprivileged user namespaces: can an ordinary user run topologies here?"""
    ok, detail = userns.probe()
    return Check("rootless", ok, f"userns: {detail}")


def check_host_lanes() -> Check:
    """Who holds the host's lane budget now (testbed.host.lanes); informational."""
    try:
        return Check("host lanes", True, host_summary())
    except OSError as exc:
        return Check("host lanes", False, f"cannot read the lane state: {_errno_text(exc)}")


def run_doctor() -> list[Check]:
    """Run every probe (in the order of CHECK_NAMES); never raises for an absent feature."""
    checks = [check_root(), check_netns(), *backend_checks(), check_rootless(),
              check_packages(), check_plugins(), check_congestion_control()]
    checks.append(_check_backend(checks))
    checks.append(check_host_lanes())
    return checks


def render_doctor(checks: Sequence[Check], console: Console) -> None:
    """Print the checks as a table, then the backend choice in one line."""
    table = Table(title="testbed doctor", show_lines=False)
    table.add_column("check", style="bold")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for check in checks:
        table.add_row(check.name, "[green]ok[/green]" if check.ok else "[red]no[/red]",
                      check.detail)
    console.print(table)
    choice = auto_backend(checks)
    console.print(f"backend auto -> {choice or 'none (loopback only)'}")
