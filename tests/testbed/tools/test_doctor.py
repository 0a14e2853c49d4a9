"""`testbed doctor`: real probes, a consistent table, nothing left behind."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from testbed.tools.doctor import (
    CHECK_NAMES,
    Check,
    auto_backend,
    check_congestion_control,
    render_doctor,
    run_doctor,
)
from tests.leftovers import watch_runs
from tests.privileges import as_nobody

REPO = Path(__file__).resolve().parents[3]


def _doctor_leaves_nothing(run: Any) -> Any:
    """Run the doctor; nothing its probes recorded (scratch ledgers of this process)
    may remain. Other runs on the host are not looked at (tests/leftovers.py)."""
    with watch_runs() as runs:
        result = run()
    if os.geteuid() == 0:
        assert runs.prefixes, "the watch saw none of the probes' ledgers"
    assert runs.leftovers() == set()
    return result


def test_doctor_reports_every_check_consistently() -> None:
    checks = _doctor_leaves_nothing(run_doctor)
    assert tuple(c.name for c in checks) == CHECK_NAMES
    for c in checks:
        assert c.detail, c
        assert "\n" not in c.detail, c
    by_name = {c.name: c for c in checks}
    assert by_name["root"].ok == (os.geteuid() == 0)
    assert by_name["python packages"].ok, by_name["python packages"].detail
    backend = by_name["backend auto"]
    choice = auto_backend(checks)
    assert backend.ok == (choice is not None)
    if choice is not None:
        assert backend.detail.startswith(choice)
    if os.geteuid() != 0:
        for name in ("netns", "veth", "tun", "netem", "tbf"):
            assert not by_name[name].ok
            assert "needs root" in by_name[name].detail


@pytest.mark.privileged
def test_doctor_kernel_probes_as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    by_name = {c.name: c for c in _doctor_leaves_nothing(run_doctor)}
    if not by_name["netns"].ok:
        pytest.skip(f"this host cannot create namespaces: {by_name['netns'].detail}")
    for name in ("veth", "tun", "netem", "tbf"):
        check = by_name[name]
        # a refusal must carry the kernel's errno, success must name what was created
        assert ("Errno" in check.detail) if not check.ok else \
            ("scratch namespace tb" in check.detail), check
    if not by_name["netem"].ok and by_name["tun"].ok:
        assert by_name["backend auto"].detail.startswith("userspace")
        assert "netem unusable" in by_name["backend auto"].detail


@pytest.mark.privileged
def test_doctor_as_an_unprivileged_user() -> None:
    """Run the real doctor as `nobody`: kernel probes say 'needs root', nothing raises."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another user")
    found = as_nobody(lambda: [[c.name, c.ok, c.detail] for c in run_doctor()])
    rows = {name: (ok, detail) for name, ok, detail in found}
    assert rows["root"][0] is False
    for name in ("netns", "veth", "tun", "netem", "tbf"):
        assert rows[name] == (False, "not probed: needs root (run `sudo testbed doctor`)")
    assert rows["backend auto"][0] is False


def test_auto_backend_prefers_netem_then_userspace() -> None:
    def checks(**ok: bool) -> list[Check]:
        return [Check(name, ok.get(name, False), "x") for name in ("netns", "veth", "tun", "netem", "tbf")]

    assert auto_backend(checks(netns=True, veth=True, tun=True, netem=True, tbf=True)) == "netem"
    assert auto_backend(checks(netns=True, veth=True, tun=True, tbf=True)) == "userspace"
    assert auto_backend(checks(netns=True, veth=True, netem=True)) is None  # no tbf, no tun
    assert auto_backend(checks(tun=True, netem=True, tbf=True, veth=True)) is None  # no netns


def test_congestion_control_check(tmp_path: Path) -> None:
    avail, default = tmp_path / "avail", tmp_path / "default"
    avail.write_text("reno bbr cubic\n")
    default.write_text("bbr\n")
    good = check_congestion_control(avail, default)
    assert good.ok
    assert "host default: bbr" in good.detail
    avail.write_text("reno bbr\n")
    missing = check_congestion_control(avail, default)
    assert not missing.ok
    assert "cubic" in missing.detail
    gone = check_congestion_control(tmp_path / "nope", default)
    assert not gone.ok
    assert "Errno 2" in gone.detail


def test_render_shows_every_row_and_the_choice() -> None:
    checks = [Check("root", True, "euid 0"), Check("netem", False, "[Errno 2 ENOENT] no"),
              Check("netns", True, "a"), Check("tun", True, "b")]
    buf = io.StringIO()
    render_doctor(checks, Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    for c in checks:
        assert c.name in out
        assert c.detail in out
    assert "backend auto -> userspace" in out
