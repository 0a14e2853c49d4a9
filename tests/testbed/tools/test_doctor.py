"""`testbed doctor`: real probes, a consistent table, nothing left behind."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from testbed.tools.doctor import (
    CHECK_NAMES,
    Check,
    auto_backend,
    check_congestion_control,
    check_plugins,
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
        assert rows[name] == (False, "not probed: needs root (run `testbed doctor` as root)")
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


def _installed_plugin(site: Path, source: str) -> None:
    """An installed distribution ``broken-policy`` whose entry point in the policy group
    names module ``broken_policy`` with SOURCE (what pip would leave in a site folder)."""
    info = site / "broken_policy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-policy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[planfence_testbed.policies]\nbroken = broken_policy\n")
    (site / "broken_policy.py").write_text(source)


def _doctor(site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "testbed", "doctor"], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_broken_installed_plugin_is_a_problem_line(tmp_path: Path) -> None:
    """Every campaign loads every installed plugin, so one that does not import fails
    them all: the doctor says so (a row, one line on stderr, exit 3) instead of all well."""
    _installed_plugin(tmp_path / "site", "import a_module_that_is_gone\n")
    with watch_runs():
        proc = _doctor(tmp_path / "site", tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "testbed doctor: problem: policy plugins: plugin 'broken-policy:broken': "
        "ModuleNotFoundError: No module named 'a_module_that_is_gone' (every campaign "
        "fails until it is fixed or uninstalled)"]
    assert "policy plugins" in proc.stdout
    assert "Traceback" not in proc.stderr
    (tmp_path / "c.toml").write_text('name = "c"\nseed = 1\ntemplates = 1\n[grid]\n'
                                     'policy = ["planfence"]\nnetwork = ["loopback"]\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    check = subprocess.run([sys.executable, "-m", "testbed", "check", "c.toml"], cwd=tmp_path,
                           env=env, text=True, capture_output=True, timeout=300, check=False)
    assert check.returncode == 3, check.stdout + check.stderr  # the installation's fault
    assert check.stderr.strip().splitlines() == [
        "testbed check: installed policy plugin 'broken-policy:broken': ModuleNotFoundError: "
        "No module named 'a_module_that_is_gone'; fix or uninstall it (`testbed doctor` "
        "checks every installed plugin)"]


def test_the_plugin_row_names_each_plugin_and_each_broken_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import nodes.plugins as plugins

    def broken() -> object:
        raise ImportError("needs numpy 9")

    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))  # loaded: forgotten after
    module = types.ModuleType("fine_policy_for_doctor")
    monkeypatch.setattr(plugins, "_entry_points", lambda: [
        ("fine-policy:fine", ("fine-policy", "1.0"), lambda: module),
        ("broken-policy:broken", ("broken-policy", "0.1"), broken)])
    check = check_plugins()
    assert not check.ok
    assert check.detail == ("plugin 'broken-policy:broken': ImportError: needs numpy 9 "
                            "(every campaign fails until it is fixed or uninstalled)")
    monkeypatch.setattr(plugins, "_entry_points", lambda: [
        ("fine-policy:fine", ("fine-policy", "1.0"), lambda: module)])
    assert check_plugins() == Check("policy plugins", True, "fine-policy:fine (no new policy)")
    monkeypatch.setattr(plugins, "_entry_points", list)
    assert check_plugins().detail == "none installed (planfence_testbed.policies)"
