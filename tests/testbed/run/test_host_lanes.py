"""Concurrent `testbed run` processes share the host (testbed/host/lanes.py).

Two real `testbed run` processes on loopback, started a moment apart and given one
lane state directory of their own (``TESTBED_LANES_DIR``, so other runs on this host
neither join nor disturb the test). A loopback cell holds the whole host, so the two
runs' node processes must never be alive at the same time; a sampler watches /proc for
each run's node processes (``python -m nodes``, or forked by its zygote) every few
milliseconds, which is evidence from outside the mechanism. A run killed with SIGKILL while it holds the host must not
keep the other waiting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.host.lanes import DIR_ENV, holders
from testbed.host.ledger import clean_dead_runs, run_state_dir

pytestmark = pytest.mark.slow

CAMPAIGN = """
name = "{name}"
seed = {seed}
templates = {templates}

[options]
episode_timeout_s = 60

[grid]
policy = ["planfence", "owner_head_freshness"]
network = ["loopback"]
rho = [4]
agents = [3]
keys = [6]
connection = ["fresh"]
units = [16]
"""


def _node_pids(pid: int) -> set[int]:
    """The node processes PID has now: children running ``-m nodes``, and the forks of
    its node zygotes (``-m nodes.zygote``, testbed/run/node_spawner.py), which keep the
    zygote's command line. A program a zygote runs is not a node: importing trio runs
    ``ldconfig -p`` (ctypes.util.find_library) as the zygote's child."""
    parents: dict[int, int] = {}
    argv: dict[int, list[bytes]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            argv[int(entry.name)] = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
    zygotes = {p for p, parent in parents.items()
               if parent == pid and b"nodes.zygote" in argv.get(p, [])}
    return {p for p, parent in parents.items()
            if (parent == pid and b"nodes" in argv.get(p, []))
            or (parent in zygotes and b"nodes.zygote" in argv.get(p, []))}


def _node_children(pid: int) -> int:
    return len(_node_pids(pid))


class Sampler:
    """Samples which runs have node processes, until stopped. A node counts in a sample
    when the previous sample saw the same process too: a node lives for seconds, while
    a program the zygote runs looks like a fork of it for the microseconds between its
    vfork and its exec, and one sample could land there."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[dict[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        previous: dict[str, set[int]] = {n: set() for n in self.pids}
        while not self.stop.is_set():
            now = {n: _node_pids(p) for n, p in self.pids.items()}
            self.samples.append({n: len(now[n] & previous[n]) for n in self.pids})
            previous = now
            time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def seen(self, name: str) -> int:
        return sum(1 for s in self.samples if s[name])

    def overlaps(self) -> int:
        return sum(1 for s in self.samples if all(s.values()))


def _start(tmp_path: Path, name: str, seed: int, templates: int, env: dict[str, str],
           *extra: str) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / f"{name}.toml"
    path.write_text(CAMPAIGN.format(name=name, seed=seed, templates=templates))
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(path), "--out",
                             str(out), *extra], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def _wait_for(pred: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_two_loopback_runs_never_overlap(tmp_path: Path) -> None:
    env = {**os.environ, DIR_ENV: str(tmp_path / "lanes")}
    first, out_a = _start(tmp_path, "first", 1, 30, env)  # long enough to be met
    try:
        _wait_for(lambda: _node_children(first.pid) > 0, "the first run started no node")
        second, out_b = _start(tmp_path, "second", 2, 4, env)
        try:
            _wait_for(lambda: any(h.waiting_loopback for h in holders(tmp_path / "lanes"))
                      or second.poll() is not None, "the second run never asked for the host")
            with Sampler({"first": first.pid, "second": second.pid}) as sampler:
                log_a, _ = first.communicate(timeout=240)
                log_b, _ = second.communicate(timeout=240)
        finally:
            second.kill()
    finally:
        first.kill()
    assert first.returncode == 0, log_a[-3000:]
    assert second.returncode == 0, log_b[-3000:]
    # both really ran episodes while the other was alive, and never at the same time
    assert sampler.seen("first") > 10
    assert sampler.seen("second") > 10
    assert sampler.overlaps() == 0
    assert "host: waiting for the loopback exclusivity: run tb" in log_b  # who held it
    assert "campaign first" in log_b
    for out in (out_a, out_b):
        assert (out / "episodes.parquet").is_file()
    assert holders(tmp_path / "lanes") == []  # both released the host on exit


def test_a_killed_holder_does_not_keep_the_host(tmp_path: Path) -> None:
    env = {**os.environ, DIR_ENV: str(tmp_path / "lanes")}
    first, _ = _start(tmp_path, "killed", 3, 30, env)
    try:
        _wait_for(lambda: _node_children(first.pid) > 0 or first.poll() is not None,
                  "the first run started no node")
        assert first.poll() is None, first.communicate()[0][-3000:]
        second, out_b = _start(tmp_path, "after", 4, 2, env)
        try:
            with Sampler({"second": second.pid}) as sampler:
                _wait_for(lambda: any(h.waiting_loopback
                                      for h in holders(tmp_path / "lanes")),
                          "the second run does not wait for the host")
                time.sleep(1.0)
                assert sampler.seen("second") == 0  # it waits while the first holds
                assert first.poll() is None
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
                log_b, _ = second.communicate(timeout=240)
        finally:
            second.kill()
    finally:
        first.kill()
        first.wait()
        clean_dead_runs(run_state_dir())
    assert second.returncode == 0, log_b[-3000:]
    assert sampler.seen("second") > 10
    assert (out_b / "episodes.parquet").is_file()
    assert holders(tmp_path / "lanes") == []  # the killed run's line is gone too
