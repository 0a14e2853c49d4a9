"""The command line: help, one-line errors, and the read-only sub-commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.cli import build_parser, main
from tests.leftovers import watch_runs
from tests.terminal import sigint_as_from_a_terminal

pytestmark = pytest.mark.slow


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize("argv", [[], ["traces"], ["bench"], ["run"], ["networks"], ["check"]])
def test_missing_arguments_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("command", ["doctor", "traces", "networks", "check", "run", "report",
                                     "clean", "bench"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: testbed" in capsys.readouterr().out


def test_traces_list_names_every_shipped_trace(tmp_path: Path) -> None:
    proc = _run("traces", "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("ATT-LTE-driving.up", "TMobile-LTE-short.down", "Verizon-LTE-short.up"):
        assert name in proc.stdout


def test_unknown_trace_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("traces", "show", "no-such-trace.up", cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_report_of_an_empty_directory_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"testbed report: {tmp_path} has no episodes.parquet (run a campaign into it first, "
        "or finish it with --resume)"]


def test_doctor_reports_a_backend_choice(tmp_path: Path) -> None:
    proc = _run("doctor", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "backend auto" in proc.stdout


@pytest.mark.privileged
def test_clean_runs_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("clean needs root")
    proc = _run("clean", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# --- whose fault it was: exit 2 (user), exit 3 (host), traceback (bug) -----------------

_FIXED = ('name = "c"\nseed = 1\ntemplates = 1\n[grid]\npolicy = ["planfence"]\n'
          'network = ["fixed"]\nagents = [2]\nkeys = [2]\nunits = [8]\n')


def _one_line(proc: subprocess.CompletedProcess[str], status: int, *fragments: str) -> str:
    assert proc.returncode == status, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_out_naming_a_file_is_the_users_fault(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(_FIXED.replace('"fixed"', '"loopback"'))
    (tmp_path / "afile").write_text("x")
    _one_line(_run("run", "c.toml", "--out", "afile", cwd=tmp_path), 2,
              "--out", "is not a directory")


def test_workdir_naming_a_file_is_the_users_fault(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(_FIXED.replace('"fixed"', '"loopback"'))
    (tmp_path / "afile").write_text("x")
    _one_line(_run("run", "c.toml", "--out", "o", "--workdir", "afile", cwd=tmp_path), 2,
              "--workdir", "is not a directory")
    assert not (tmp_path / "o").exists()


def test_a_bad_campaign_field_is_the_users_fault(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(_FIXED.replace('"fixed"', '"wifi"'))
    _one_line(_run("run", "c.toml", cwd=tmp_path), 2, "grid.network", "allowed: loopback")


@pytest.mark.privileged
def test_netem_on_a_kernel_without_it_is_the_hosts_fault(tmp_path: Path) -> None:
    from testbed.links.netem import netem_available

    if os.geteuid() != 0:
        pytest.skip("needs root to reach the backend choice")
    if netem_available()[0]:
        pytest.skip("this kernel has sch_netem (the VM lane runs netem for real)")
    (tmp_path / "c.toml").write_text(_FIXED)
    _one_line(_run("run", "c.toml", "--out", "o", "--backend", "netem", cwd=tmp_path), 3,
              "backend netem", "sch_netem")


@pytest.mark.privileged
def test_a_missing_tun_device_is_the_hosts_fault(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to reach the backend choice")
    (tmp_path / "c.toml").write_text(_FIXED)
    script = ("import sys; from testbed.host import kernel; "
              "kernel.TUN_PATH = '/nonexistent/net/tun'; from testbed.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "TESTBED_FRESH_PROBES": "1"}  # probe here, not the boot's verdict
    proc = subprocess.run([sys.executable, "-c", script, "run", "c.toml", "--out", "o",
                           "--backend", "userspace"], cwd=tmp_path, text=True, env=env,
                          capture_output=True, timeout=120, check=False)
    _one_line(proc, 3, "/nonexistent/net/tun does not exist", "modprobe tun")


@pytest.mark.parametrize("command", ["run", "check"])
def test_neither_root_nor_user_namespaces_is_the_hosts_fault(tmp_path: Path,
                                                             command: str) -> None:
    """`check` says it too: nothing fails in `run` that `check` passed."""
    (tmp_path / "c.toml").write_text(_FIXED)
    script = ("import os, sys; os.geteuid = lambda: 1000\n"
              "import testbed.host.userns as u; u.probe = lambda: (False, 'disabled here')\n"
              "from testbed.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, command, "c.toml"], cwd=tmp_path,
                          text=True, capture_output=True, timeout=120, check=False)
    _one_line(proc, 3, "needs root or unprivileged user namespaces (disabled here)")
    assert list(tmp_path.iterdir()) == [tmp_path / "c.toml"]


def test_a_bug_shows_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the user's nor the host's fault: main lets it through (exit 1, traceback)."""
    import testbed.cli as cli
    import testbed.tools.doctor as doctor

    def broken() -> object:
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(doctor, "run_doctor", broken)
    with pytest.raises(ValueError, match="internal invariant"):
        cli.main(["doctor"])


def test_a_bug_exits_1_with_a_traceback(tmp_path: Path) -> None:
    script = ("import sys, testbed.cli as cli, testbed.tools.doctor as doctor\n"
              "def broken(): raise KeyError('bug')\n"
              "doctor.run_doctor = broken\n"
              "sys.exit(cli.main(['doctor']))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "KeyError: 'bug'" in proc.stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("testbed ")


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mixed-team" / "campaign.toml"
_NOT_ROOT = ("import os, sys; os.geteuid = lambda: 1000; from testbed.cli import main; "
             "sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("argv", [["check", str(EXAMPLE)],
                                  ["run", str(EXAMPLE), "--dry-run", "--out", "o"]])
def test_check_and_dry_run_print_the_plan_and_create_nothing(tmp_path: Path,
                                                             argv: list[str]) -> None:
    # as a non-root user (euid 1000): a run that went on to build anything would stop with
    # "needs root" (exit 3) before creating it
    proc = subprocess.run([sys.executable, "-c", _NOT_ROOT, *argv], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for fragment in ("2 cells x 2 templates = 4 episodes", "network field (defined in the "
                     "campaign)", "hosts.1: up 13.3 Mbit/s (TMobile-LTE-short.up)",
                     "hosts.central: up 100 Mbit/s; down 100 Mbit/s; delay 2 ms",
                     "agent to agent 80-180 ms", "agent to central 44-144 ms",
                     "netem refuses: network field, host a2: delay_trace",
                     "estimated wall time: about", "nothing was created"):
        assert fragment in out, (fragment, out)
    assert list(tmp_path.iterdir()) == []  # no run directory, no results/


def test_networks_list_and_show(tmp_path: Path) -> None:
    listing = _run("networks", "list", "--campaign", str(EXAMPLE), cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    for name in ("loopback", "fixed", "att", "tmobile", "field"):
        assert name in listing.stdout
    shown = _run("networks", "show", "field", "--campaign", str(EXAMPLE), "--plot", "f.png",
                 cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "[networks.field]" in shown.stdout
    assert "[networks.field.hosts.central]" in shown.stdout
    assert "rate_kbit = 100000" in shown.stdout
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")
    att = _run("networks", "show", "att", cwd=tmp_path)
    assert 'up_trace = "ATT-LTE-driving.up"' in att.stdout
    assert "longest outage 78.3 s" in att.stdout
    _one_line(_run("networks", "show", "mars", cwd=tmp_path), 2, "network: unknown profile")


def test_packet_logs_on_a_cluster_are_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _NOT_ROOT, "run", str(EXAMPLE), "--out", "o",
                           "--cluster", "tcp://127.0.0.1:1"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)
    _one_line(proc, 2, "options.link_log: packet logs are written by runs in this process")
    assert list(tmp_path.iterdir()) == []


def test_examples_list_and_copy_run_from_anywhere(tmp_path: Path) -> None:
    listing = _run("examples", "list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "mixed-team: own LTE traces" in listing.stdout
    copied = _run("examples", "copy", "mixed-team", "mine", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "mine" / "traces" / "field-lte.up").is_file()
    checked = _run("check", "mine/campaign.toml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "network field (defined in the campaign)" in checked.stdout


def test_traces_show_takes_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "mine.up").write_text("0\n5\n10\n")
    proc = _run("traces", "show", "mine.up", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3" in proc.stdout
    assert "up" in proc.stdout
    (tmp_path / "plain.txt").write_text("1\n")
    proc = _run("traces", "show", "plain.txt", "--direction", "down", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "12.000 Mbit/s" in proc.stdout


def test_spread_write_defaults_to_the_shipped_table() -> None:
    """The command line names the table without importing testbed.report.spread."""
    from testbed.report.spread import SPREAD_TABLE

    args = build_parser().parse_args(["spread", "somewhere", "--write"])
    assert Path(args.write) == SPREAD_TABLE


def test_bench_lanes_can_leave_out_the_cluster_rows() -> None:
    assert build_parser().parse_args(["bench", "lanes", "--workers", "none"]).workers == ()
    assert build_parser().parse_args(["bench", "lanes", "--workers", "1,4"]).workers == (1, 4)
    assert build_parser().parse_args(["bench", "lanes"]).workers == (1, 2, 4)


# --- interrupts: one line, exit 128 + the signal, nothing left behind ------------------

_SMALL_RUN = """
name = "intr"
seed = 11
templates = 6
[options]
episode_timeout_s = 120
[grid]
policy = ["local_replica", "planfence"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["fresh"]
units = [16]
"""


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status"), [
    (signal.SIGINT, 130),
    (signal.SIGTERM, 143)])
def test_an_interrupted_run_says_what_it_kept_in_one_line(tmp_path: Path, signum: int,
                                                           status: int) -> None:
    """Ctrl-C (or SIGTERM) once the first episode is committed: everything the run
    started is removed, then one line says how many episodes it kept (exit 128 + the
    signal; no traceback of trio's exception groups), and --resume finishes it."""
    (tmp_path / "c.toml").write_text(_SMALL_RUN)
    out = tmp_path / "out"
    shards = out / "shards" / "episodes"
    with watch_runs() as runs:
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "c.toml", "--out",
                                 str(out)], cwd=tmp_path, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=sigint_as_from_a_terminal)
        try:
            deadline = time.monotonic() + 120
            while not (shards.is_dir() and any(shards.glob("*.parquet"))):
                assert proc.poll() is None, "the run ended before its first episode"
                assert time.monotonic() < deadline, "no episode committed within 120 s"
                time.sleep(0.05)
            proc.send_signal(signum)
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = runs.wait_clean()
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    kept = len(list(shards.glob("*.parquet")))
    assert kept >= 1
    word = "episode" if kept == 1 else "episodes"
    assert lines[0] == f"testbed: interrupted; {kept} {word} kept, resume with --resume"
    assert runs.prefixes, "the watch saw none of the run's ledgers"
    assert left == set(), "the interrupted run left something behind"
    assert not (tmp_path / "out" / "failures.log").exists()
    resumed = _run("run", "c.toml", "--out", str(out), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(list(shards.glob("*.parquet"))) == 12


def test_the_api_refuses_to_resume_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    from testbed import api
    from testbed.errors import UserError

    campaign = api.from_dict({"name": "c", "seed": 1, "templates": 1,
                              "grid": {"policy": "planfence", "network": "loopback"}})
    for flag in ("resume", "extend"):
        with pytest.raises(UserError, match=rf"^{flag}=True: .*gone does not exist; there "
                           rf"is no run to {flag}"):
            api.run(campaign, tmp_path / "gone", resume=flag == "resume",
                    extend=flag == "extend")
    assert list(tmp_path.iterdir()) == []
