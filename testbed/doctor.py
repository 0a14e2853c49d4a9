"""`testbed doctor`: functional probes of what this host can emulate.

Rules:

- Probe by doing, never by reading module lists (there is no lsmod here): create a
  scratch namespace, a veth pair, a TUN device, a netem and a tbf qdisc, and report
  what the kernel said (errno included) when it refused.
- Every probe names what it creates `tbdoc<pid>...` and removes it in `finally`.
- Without root the kernel probes are reported as not possible, not as failures of the
  kernel; the table still shows packages and congestion controls.
- `auto_backend` is the one place that turns probe results into a backend choice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.metadata
import itertools
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.links.netem import netem_available, probe_qdisc, scratch_netns, tbf_params
from testbed.links.profiles import DEFAULT_CONGESTION_CONTROL
from testbed.netns import run_in_netns

__all__ = [
    "CHECK_NAMES",
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
    "python packages",
    "congestion control",
    "backend auto",
)

REQUIRED_PACKAGES: dict[str, tuple[int, ...]] = {
    "trio": (0, 27),
    "pyroute2": (0, 9, 2),
    "msgpack": (1, 2, 1),
    "PyNaCl": (1, 6, 2),
    "numpy": (1, 26),
    "pandas": (2, 2),
    "pyarrow": (15,),
    "matplotlib": (3, 8),
    "rich": (13,),
}
"""Distribution -> minimum version (msgpack and PyNaCl minimums close security bugs)."""

CC_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
CC_DEFAULT = Path("/proc/sys/net/ipv4/tcp_congestion_control")

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_counter = itertools.count()


@dataclass(frozen=True)
class Check:
    """One probe's verdict; `detail` says what was tried and, on failure, the errno."""

    name: str
    ok: bool
    detail: str


def _tag() -> str:
    """A fresh run-specific prefix, short enough for interface names (<= 13 chars)."""
    return f"tbdoc{os.getpid() % 1_000_000}{next(_counter) % 10}"


def _errno_text(exc: OSError) -> str:
    code = exc.errno
    if code:
        return f"[Errno {code} {errno.errorcode.get(code, '?')}] {os.strerror(code)}"
    return str(exc)


def _need_root(name: str) -> Check | None:
    if os.geteuid() != 0:
        return Check(name, False, "not probed: needs root (run `sudo testbed doctor`)")
    return None


def check_root() -> Check:
    euid = os.geteuid()
    if euid == 0:
        return Check("root", True, "running as root (euid 0)")
    return Check("root", False, f"euid {euid}: namespaces, TUN and qdiscs need root")


def check_netns() -> Check:
    from pyroute2 import netns as pr_netns

    if (skip := _need_root("netns")) is not None:
        return skip
    name = f"{_tag()}n"
    try:
        pr_netns.create(name)
    except OSError as exc:
        return Check("netns", False, f"creating namespace {name} failed: {_errno_text(exc)}")
    try:
        present = name in pr_netns.listnetns()
    finally:
        with contextlib.suppress(OSError):
            pr_netns.remove(name)
    if not present:
        return Check("netns", False, f"namespace {name} was created but is not listed")
    return Check("netns", True, f"created and removed namespace {name}")


def check_veth() -> Check:
    if (skip := _need_root("veth")) is not None:
        return skip
    tag = _tag()
    try:
        with scratch_netns(tag) as (name, _ipr):
            return Check("veth", True, f"veth pair {tag}a/{tag}b up in scratch namespace {name}")
    except OSError as exc:
        return Check("veth", False, f"scratch namespace with a veth pair failed: {exc}")


def _open_tun(ifname: str) -> str:
    """Open /dev/net/tun and attach a TUN device; the device goes when the fd closes."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        ifr = struct.pack("16sH", ifname.encode(), _IFF_TUN | _IFF_NO_PI)
        fcntl.ioctl(fd, _TUNSETIFF, ifr)
    finally:
        os.close(fd)
    return ifname


def check_tun() -> Check:
    from pyroute2 import netns as pr_netns

    if (skip := _need_root("tun")) is not None:
        return skip
    if not os.path.exists("/dev/net/tun"):
        return Check("tun", False, "/dev/net/tun does not exist (no TUN driver)")
    tag = _tag()
    name, ifname = f"{tag}n", f"{tag}t"
    try:
        pr_netns.create(name)
    except OSError as exc:
        return Check("tun", False, f"creating namespace {name} failed: {_errno_text(exc)}")
    try:
        run_in_netns(name, lambda: _open_tun(ifname))
    except OSError as exc:
        return Check("tun", False, f"TUNSETIFF {ifname} in {name} failed: {_errno_text(exc)}")
    finally:
        with contextlib.suppress(OSError):
            pr_netns.remove(name)
    return Check("tun", True, f"TUN device {ifname} created via TUNSETIFF in namespace {name}")


def check_netem() -> Check:
    if (skip := _need_root("netem")) is not None:
        return skip
    ok, detail = netem_available(prefix=_tag())
    return Check("netem", ok, detail)


def check_tbf() -> Check:
    if (skip := _need_root("tbf")) is not None:
        return skip
    ok, detail = probe_qdisc("tbf", tbf_params(1000.0, limit_bytes=150_000), prefix=_tag())
    return Check("tbf", ok, detail)


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


def auto_backend(checks: Sequence[Check]) -> str | None:
    """The backend `--backend auto` picks: netem where it works, else userspace, else none."""
    ok = {c.name: c.ok for c in checks}
    if ok.get("netns") and ok.get("veth") and ok.get("netem") and ok.get("tbf"):
        return "netem"
    if ok.get("netns") and ok.get("tun"):
        return "userspace"
    return None


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


PROBES: tuple[Callable[[], Check], ...] = (
    check_root,
    check_netns,
    check_veth,
    check_tun,
    check_netem,
    check_tbf,
    check_packages,
    check_congestion_control,
)


def run_doctor() -> list[Check]:
    """Run every probe (in the order of CHECK_NAMES); never raises for an absent feature."""
    checks = [probe() for probe in PROBES]
    checks.append(_check_backend(checks))
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
