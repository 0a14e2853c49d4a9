"""The launcher of users' programs: namespaces, exit statuses, and its one dangerous call
(``kill(-1)``) guarded to PID 1 of a namespace of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.host import kernel, launcher
from testbed.host.ledger import new_prefix


def test_signalling_every_process_is_refused_outside_a_pid_namespace() -> None:
    """Signal 0 checks permissions only, so even without the guard nothing is signalled;
    with it the child refuses (exit 125) instead of reaching every process."""
    pid = os.fork()
    if pid == 0:
        try:
            launcher._signal_namespace(0)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == launcher.EXIT_SETUP


def _launch(*args: str, netns: str | None = None, hosts: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-I", "-S", str(Path(launcher.__file__)), "--hostname", "h1",
            "--grace-s", "1"]
    if netns is not None:
        argv += ["--netns", netns]
    if hosts is not None:
        argv += ["--hosts-file", str(hosts)]
    return subprocess.run([*argv, "--", *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.privileged
def test_a_command_sees_its_host_and_takes_what_it_started_with_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for namespaces")
    netns = f"{new_prefix()}-h1"
    hosts = tmp_path / "hosts"
    hosts.write_text("198.18.0.7\tpeer\n")
    kernel.create_netns(netns)
    try:
        script = ("echo $$; hostname; getent hosts peer; ls /sys/class/net; "
                  "sleep 3021 & echo $!; exit 4")
        proc = _launch("sh", "-c", script, netns=netns, hosts=hosts)
    finally:
        kernel.remove_netns(netns)
    assert proc.returncode == 4, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[0] == "2"  # PID 1 is the launcher's init; the command is 2
    assert lines[1] == "h1"
    assert lines[2].split() == ["198.18.0.7", "peer"]
    assert lines[3] == "lo"  # the namespace's own sysfs
    assert not _running(b"sleep\x003021")  # the PID namespace went with its init


def _running(cmdline: bytes) -> bool:
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if path.read_bytes().startswith(cmdline):
                return True
        except OSError:
            continue
    return False


@pytest.mark.privileged
def test_exit_statuses_of_commands_that_cannot_run(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for namespaces")
    missing = _launch("no-such-command-here")
    assert missing.returncode == launcher.EXIT_NOT_FOUND
    assert "no-such-command-here" in missing.stderr
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    assert _launch(str(plain)).returncode == launcher.EXIT_CANNOT_RUN
    assert _launch("sh", "-c", "kill -9 $$").returncode == 128 + 9
    bad = _launch("true", netns="tbnone00-x")
    assert bad.returncode == launcher.EXIT_SETUP
