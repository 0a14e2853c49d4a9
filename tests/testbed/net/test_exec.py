"""`testbed exec` and `testbed shell` on real namespaces: unchanged programs over emulated
links, and nothing left behind (privileged).

Every test runs the command line as a user would (a child process) and checks, by the
run prefix the banner names, that the run's namespaces, links, ledger and processes are
gone afterwards (only what this run created is counted: other engineers' runs share the
host). Timing assertions are physics with wide margins.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.host import ledger as ledger_mod
from testbed.host.processes import is_running
from tests.leftovers import prefix_objects, watch_runs
from tests.privileges import require_netem
from tests.terminal import sigint_as_from_a_terminal

pytestmark = pytest.mark.privileged

PREFIX = re.compile(r"run prefix (tb[0-9a-f]+)")
RTT = re.compile(r"rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/")


@pytest.fixture(autouse=True)
def _privileged() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")


def run_testbed(*args: str, cwd: Path, stdin: str | None = None, timeout: float = 180
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=timeout, check=False)


def prefix_of(stderr: str) -> str:
    match = PREFIX.search(stderr)
    assert match, stderr
    return match.group(1)


def processes_with(*tokens: bytes) -> list[int]:
    """Processes whose command line holds every token (a zombie's is empty)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(token in cmdline for token in tokens):
            found.append(int(entry.name))
    return found


def launchers_of(prefix: str) -> list[int]:
    """Processes of this run's launchers (their command line names the run's netns)."""
    return processes_with(b"launcher.py", f"{prefix}-".encode())


def assert_nothing_left(prefix: str, recorded: list[dict[str, Any]] | None = None) -> None:
    assert prefix_objects(prefix) == []
    assert launchers_of(prefix) == []
    alive = [e["pid"] for e in recorded or [] if is_running(int(e["pid"]),
                                                            e.get("start_ticks"))]
    assert alive == []


def test_exec_runs_a_command_on_every_host_and_returns_its_status(tmp_path: Path) -> None:
    proc = run_testbed("exec", "fixed", "--hosts", "3", "--", "sh", "-c",
                   'echo "$(hostname) $TESTBED_HOST {addr} $TESTBED_ADDR_A2"; '
                   'test "$TESTBED_HOST" != a1', cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # a1's command failed: the run's status
    for i in range(3):
        assert f"a{i} a{i} 198.18.0.{i + 1} 198.18.0.3" in proc.stdout
    assert "== a1 (exit 1) ==" in proc.stdout
    assert_nothing_left(prefix_of(proc.stderr))
    one = run_testbed("exec", "fixed", "--on", "x", "--", "sh", "-c", "exit 7", cwd=tmp_path)
    assert one.returncode == 7, one.stderr


LEAN = """
import runpy, sys
HEAVY = ("numpy", "pandas", "rich", "importlib.metadata")
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY or name.split(".")[0] in HEAVY:
            raise ImportError(f"testbed exec on a fixed network imported {name}")
sys.meta_path.insert(0, Refuse())
sys.argv = ["testbed", *sys.argv[1:]]
runpy.run_module("testbed", run_name="__main__")
"""


def test_exec_on_a_fixed_network_loads_no_heavy_module(tmp_path: Path) -> None:
    """The controller's imports are most of exec's start (docs/benchmarks.md): a fixed
    network needs no trace arrays (numpy), no tables (pandas), no console (rich)."""
    proc = subprocess.run([sys.executable, "-c", LEAN, "exec", "fixed", "--hosts", "2", "--",
                           "true"], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== a1 (exit 0) ==" in proc.stdout
    assert_nothing_left(prefix_of(proc.stderr))


def test_more_hosts_than_the_fd_limit_allows_are_one_line_before_anything(
        tmp_path: Path) -> None:
    """The host limit follows this machine (testbed.net.capacity): under `ulimit -n 256`
    a 100-host network is refused before a namespace exists, naming the limit."""
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.run([sys.executable, "-m", "testbed", "exec", "fixed", "--hosts", "100",
                           "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False, preexec_fn=low_limit)
    assert proc.returncode == 2, proc.stderr
    # one line and no banner: nothing was built (the banner names the run's prefix)
    assert proc.stderr.splitlines() == [
        "testbed exec: --hosts: 100 is more than this machine can run; allowed: 1..48 (set "
        "by the fd limit 256 (ulimit -n; 4 per host))"]
    fine = subprocess.run([sys.executable, "-m", "testbed", "exec", "fixed", "--hosts", "40",
                           "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, check=False, preexec_fn=low_limit)
    assert fine.returncode == 0, fine.stderr[-2000:]
    assert_nothing_left(prefix_of(fine.stderr))


def test_a_python_http_server_and_client_over_att(tmp_path: Path) -> None:
    """Unchanged third-party programs: python's http.server and a urllib client, reached
    by address and by name, over the AT&T links."""
    client = ("import urllib.request as u; "
              "print(u.urlopen('http://s:8000/', timeout=30).status, "
              "u.urlopen('http://{addr:s}:8000/', timeout=30).status)")
    proc = run_testbed("exec", "att", "--output", "out", "--on", "s", "--service", "--ready",
                   "tcp:8000", "--", "python3", "-m", "http.server", "8000",
                   "--on", "c", "--", "python3", "-c", client, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stderr, (tmp_path / "out/c.err").read_text())
    assert (tmp_path / "out/c.out").read_text().split() == ["200", "200"]
    log = (tmp_path / "out/s.err").read_text()
    assert log.count('"GET / HTTP/1.1" 200') == 2
    assert "198.18.0.2" in log  # from c
    assert_nothing_left(prefix_of(proc.stderr))


def test_ping_reads_the_configured_round_trip(tmp_path: Path) -> None:
    """20 ms per link crossing, two hosts: 4 x 20 = 80 ms (docs/links.md)."""
    proc = run_testbed("exec", "fixed", "--delay-ms", "20", "--link-log", "logs", "--on", "c",
                   "--", "ping", "-c", "10", "-i", "0.2", "{addr:s}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    match = RTT.search(proc.stdout)
    assert match, proc.stdout
    low, avg, _ = (float(x) for x in match.groups())
    assert low >= 79.5, proc.stdout
    assert avg <= 80 + 15, proc.stdout
    assert "10 received" in proc.stdout
    # --link-log: every echo request left c's uplink (84 IP bytes) and was logged
    departures = [line for line in (tmp_path / "logs/c.up.log").read_text().splitlines()
                  if " - 84 " in line]
    assert len(departures) >= 10
    assert_nothing_left(prefix_of(proc.stderr))


def test_an_unshaped_host_and_per_host_congestion_control(tmp_path: Path) -> None:
    """--unshaped s: c to s crosses only c's link, 2 x 20 ms; --cc a host's default."""
    proc = run_testbed("exec", "fixed", "--delay-ms", "20", "--unshaped", "s", "--cc",
                       "s=reno", "--on", "c", "--", "ping", "-c", "5", "-i", "0.2",
                       "{addr:s}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    match = RTT.search(proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) >= 39.5, proc.stdout
    assert float(match.group(2)) <= 40 + 15, proc.stdout
    assert_nothing_left(prefix_of(proc.stderr))
    cc = run_testbed("exec", "fixed", "--host", "c", "--host", "s", "--cc", "s=reno", "--",
                     "cat", "/proc/sys/net/ipv4/tcp_congestion_control", cwd=tmp_path)
    assert cc.returncode == 0, cc.stderr
    assert "== c (exit 0) ==\ncubic\n" in cc.stdout
    assert "== s (exit 0) ==\nreno\n" in cc.stdout


RECEIVER = """
import json, socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 5001)); srv.listen(1)
conn, _ = srv.accept()
marks = []
while True:
    data = conn.recv(1 << 16)
    if not data:
        break
    marks.append((time.monotonic(), len(data)))
start = marks[0][0] + 1.0  # past slow start
late = [(t, n) for t, n in marks if t >= start]
print(json.dumps({"bytes": sum(n for _, n in late), "seconds": late[-1][0] - late[0][0]}))
"""
SENDER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5001))
block, end = b"x" * 65536, time.monotonic() + 6
while time.monotonic() < end:
    s.sendall(block)
s.close()
"""


def test_a_tcp_stream_through_exec_moves_at_the_links_rate(tmp_path: Path) -> None:
    (tmp_path / "recv.py").write_text(RECEIVER)
    (tmp_path / "send.py").write_text(SENDER)
    proc = run_testbed("exec", "fixed", "--rate-kbit", "12000", "--delay-ms", "5", "--output",
                   "out", "--on", "r", "--ready", "tcp:5001", "--", "python3", "recv.py",
                   "--on", "t", "--", "python3", "send.py", "{addr:r}", cwd=tmp_path)
    assert proc.returncode == 0, (proc.stderr, (tmp_path / "out/r.err").read_text())
    got = json.loads((tmp_path / "out/r.out").read_text())
    rate_kbit = got["bytes"] * 8 / got["seconds"] / 1000
    goodput = 12_000 * 1448 / 1500  # TCP payload of full-size segments (timestamps on)
    assert 0.9 * goodput <= rate_kbit <= 1.02 * 12_000, got
    assert_nothing_left(prefix_of(proc.stderr))


def test_a_hanging_command_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = run_testbed("exec", "fixed", "--timeout", "2", "--on", "a", "--", "sh", "-c",
                   "trap '' TERM; sleep 3017 & sleep 3017", cwd=tmp_path)
    took = time.monotonic() - started
    assert proc.returncode == 124, proc.stderr
    assert "timeout after 2 s; stopped: a" in proc.stderr
    assert took < 60
    # the command and its child ignore SIGTERM: the PID namespace's end takes them
    assert processes_with(b"sleep\x003017") == []
    assert_nothing_left(prefix_of(proc.stderr))


def _start_and_wait(tmp_path: Path) -> tuple[subprocess.Popen[str], str, list[dict[str, Any]]]:
    """A controller with a long command (and a child of it) running on two hosts; its
    prefix and the processes its ledger records."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "exec", "fixed", "--hosts", "2", "--", "sh", "-c",
         "sleep 3018 & touch ready-$TESTBED_HOST; wait"], cwd=tmp_path, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    prefix = prefix_of(banner)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-a{i}").exists() for i in range(2)):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    body = json.loads((ledger_mod.STATE_DIR / f"{prefix}.json").read_text())
    recorded = [e for e in body["entries"] if e["kind"] == "process"]
    assert len(recorded) == 3  # the emulator and two launchers
    assert len(launchers_of(prefix)) >= 2
    assert len(processes_with(b"sleep\x003018")) == 2
    return proc, prefix, recorded


def test_sigterm_to_the_controller_leaves_nothing(tmp_path: Path) -> None:
    proc, prefix, recorded = _start_and_wait(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert_nothing_left(prefix, recorded)
    assert processes_with(b"sleep\x003018") == []


@pytest.mark.parametrize(("signum", "status"), [
    (signal.SIGINT, 130),
    (signal.SIGTERM, 143)])
def test_an_interrupted_exec_is_one_line_and_leaves_nothing(tmp_path: Path, signum: int,
                                                            status: int) -> None:
    """Ctrl-C or SIGTERM while `sleep 30` runs: the commands are stopped, the network
    removed, then `testbed: interrupted` alone on stderr (no traceback of trio's
    exception groups) and exit 128 + the signal."""
    with watch_runs() as runs:
        proc = subprocess.Popen(
            [sys.executable, "-m", "testbed", "exec", "fixed", "--quiet", "--hosts", "2",
             "--", "sh", "-c", "touch ready-$TESTBED_HOST; exec sleep 30"], cwd=tmp_path,
            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=sigint_as_from_a_terminal)
        try:
            deadline = time.monotonic() + 60
            while not all((tmp_path / f"ready-a{i}").exists() for i in range(2)):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            proc.send_signal(signum)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = runs.wait_clean()
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["testbed: interrupted"], stderr
    assert runs.prefixes, "the watch saw none of the run's ledgers"
    assert left == set()


def test_kill_9_then_clean_leaves_nothing(tmp_path: Path) -> None:
    proc, prefix, recorded = _start_and_wait(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert prefix_objects(prefix), "nothing to clean: the test would prove nothing"
    clean = run_testbed("clean", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    assert f"removed netns {prefix}-a0" in clean.stdout
    deadline = time.monotonic() + 10  # launchers stop themselves when the controller dies
    while launchers_of(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_nothing_left(prefix, recorded)
    assert processes_with(b"sleep\x003018") == []


def test_shell_runs_piped_commands_over_att(tmp_path: Path) -> None:
    script = ("echo host=$(hostname)\n"
              "ping -c 3 -i 0.3 -q a1 | tail -1\n"
              "python3 -m http.server 8019 --directory . >/dev/null 2>&1 &\n"
              "sleep 1\n"
              "exit 5\n")
    proc = run_testbed("shell", "att", "--host", "a1", "--host", "a0", "--on", "a0",
                   "--shell", "/bin/sh", cwd=tmp_path, stdin=script)
    assert proc.returncode == 5, proc.stderr  # the shell's status
    assert "host=a0" in proc.stdout
    assert RTT.search(proc.stdout), proc.stdout
    prefix = prefix_of(proc.stderr)
    assert_nothing_left(prefix)
    assert processes_with(b"http.server\x008019") == []  # went with the shell


@pytest.mark.netem
def test_ping_over_the_netem_backend(tmp_path: Path) -> None:
    require_netem()
    proc = run_testbed("exec", "fixed", "--backend", "netem", "--delay-ms", "20", "--on", "c",
                   "--", "ping", "-c", "5", "-i", "0.2", "{addr:s}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    match = RTT.search(proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) >= 79.5, proc.stdout
    assert_nothing_left(prefix_of(proc.stderr))
