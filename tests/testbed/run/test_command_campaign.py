"""A command workload end to end: a user's own small program (no testbed imports) runs per
host in every episode, reports through the metrics protocol, survives an interrupted
run without repeating episodes, and reports (privileged, real namespaces)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.leftovers import watch_runs

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

SERVER = """
import socketserver, sys
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(line)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""
CLIENT = """
import json, os, socket, sys, time
me, t0 = os.environ["TESTBED_HOST"], int(os.environ["TESTBED_T0_NS"])
doc = json.load(open(os.environ["TESTBED_SCHEDULE"]))
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
reader = sock.makefile("rb")
out = open(os.environ["TESTBED_METRICS"], "a")
for i in doc["by_host"].get(me, []):
    event = doc["events"][i]
    wait = t0 / 1e9 + event["t_ms"] / 1e3 - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    if event["kind"] != "act":
        continue
    start = time.monotonic_ns()
    sock.sendall(event["action"].encode() + b"\\n")
    ok = reader.readline().strip() == event["action"].encode()
    out.write(json.dumps({"event": "action", "action": event["action"], "ok": ok,
                          "stall_ms": (time.monotonic_ns() - start) / 1e6, "t_ns": start,
                          "policy": os.environ["TESTBED_POLICY"]}) + "\\n")
out.write(json.dumps({"event": "episode", "seed": int(os.environ["TESTBED_SEED"]) % 1000})
          + "\\n")
"""
CAMPAIGN = """
name = "own-echo"
seed = 5
templates = 3
kind = "command"

[options]
episode_timeout_s = 60
link_log = true

[networks.lan]
rate_kbit = 20000
delay_ms = 5

[networks.lan.hosts.echo]
unshaped = true

[command]
hosts = ["echo"]
timeout_s = 45
unit_ms = 60
lead_ms = 1500

[[command.run]]
on = "echo"
cmd = "python3 server.py 7100"
service = true
ready = "tcp:7100"

[[command.run]]
on = "agents"
argv = ["python3", "client.py", "{addr:echo}", "7100"]

[grid]
network = ["lan"]
policy = ["echo-v1"]
agents = [2]
keys = [4]
units = [16]
rho = [1]
"""


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("needs /dev/net/tun")
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    (tmp_path / "c.toml").write_text(CAMPAIGN)
    return tmp_path


def _testbed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=600, check=False)


def _check_results(out: Path) -> None:
    episodes = pd.read_parquet(out / "episodes.parquet")
    actions = pd.read_parquet(out / "actions.parquet")
    assert len(episodes) == 3
    assert episodes["episode"].is_unique
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    assert (episodes["attempted_actions"] == episodes["scheduled_actions"]).all()
    assert len(actions) == int(episodes["scheduled_actions"].sum())
    assert not actions.duplicated(["episode", "action"]).any()
    assert actions["ok"].all()
    assert set(actions["policy"]) == {"echo-v1"}
    assert {json.loads(m)["policy"] for m in actions["metrics"]} == {"echo-v1"}
    assert actions["unit"].notna().all()
    assert actions["planner"].notna().all()
    assert (actions["executor"] == actions["host"]).all()
    # over the lan link: 2 x (5 + 0) ms of propagation per round trip, at least
    assert actions["stall_ms"].min() >= 10.0, actions["stall_ms"].describe()
    assert (actions["t_ms"] >= 1500).all()  # after the lead, on the trace's clock
    for row in episodes.to_dict("records"):
        per_host = json.loads(row["link_host_bytes"])
        assert set(per_host) == {"a0", "a1", "echo"}
        assert all(per_host[h]["up_bytes"] > 0 for h in per_host)
        programs = {p["label"]: p for p in json.loads(row["programs"])}
        assert programs["echo"]["stopped"] == "service"
        assert programs["a0"]["status"] == 0
        assert row["link_up_qdelay_p50_ms"] is not None
        assert (out / row["link_log"] / "a0.up.log").exists()
        assert set(json.loads(row["metrics"])) == {"a0", "a1"}


def test_a_command_workload_runs_and_reports(campaign_dir: Path) -> None:
    out = campaign_dir / "out"
    proc = _testbed("run", "c.toml", "--out", str(out), cwd=campaign_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failed/actions" in proc.stdout
    _check_results(out)
    episode_dirs = sorted((out / "commands").iterdir())
    assert len(episode_dirs) == 3
    assert {"schedule.json", "echo.out", "a0.metrics.jsonl"} <= {
        p.name for p in episode_dirs[0].iterdir()}
    report = _testbed("report", str(out), "--draws", "100", cwd=campaign_dir)
    assert report.returncode == 0, report.stderr[-3000:]
    for name in ("tables/table_command.csv", "tables/table_command_links.csv",
                 "tables/table_command_metrics.csv", "figures/fig_command_stall.png",
                 "figures/fig_link_lan.png", "report.md", "report.html"):
        assert (out / name).exists(), name
    table = pd.read_csv(out / "tables/table_command.csv")
    assert table["actions"].sum() == len(pd.read_parquet(out / "actions.parquet"))
    assert table["ok_share"].tolist() == [1.0]


def test_an_interrupted_command_workload_resumes_without_repeating(campaign_dir: Path
                                                                   ) -> None:
    out = campaign_dir / "out"
    with watch_runs() as runs:  # the killed run's and the resumed run's, nothing else
        _interrupt_and_resume(campaign_dir, out)
    assert runs.prefixes, "no run was watched: the check below would prove nothing"
    assert runs.wait_clean() == set()


def _interrupt_and_resume(campaign_dir: Path, out: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "c.toml", "--out",
                             str(out)], cwd=campaign_dir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    shards = out / "shards" / "episodes"
    try:
        deadline = time.monotonic() + 240
        while not (shards.is_dir() and list(shards.glob("*.parquet"))):
            assert proc.poll() is None, "the run ended before its first episode"
            assert time.monotonic() < deadline, "no episode was committed"
            time.sleep(0.05)
        first = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.parquet")}
        time.sleep(1.0)  # the next episode's programs are running
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(list(shards.glob("*.parquet"))) < 3, "the run finished: nothing to resume"
    resumed = _testbed("run", "c.toml", "--out", str(out), "--resume", cwd=campaign_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _check_results(out)
    for name, mtime in first.items():  # committed episodes are kept, not run again
        assert (shards / name).stat().st_mtime_ns == mtime
    with sqlite3.connect(out / "state.sqlite") as db:
        attempts = dict(db.execute("SELECT key, attempts FROM episodes").fetchall())
    assert len(attempts) == 3
    assert sum(attempts.values()) <= 4  # at most the episode in flight ran twice
    clean = _testbed("clean", cwd=campaign_dir)
    assert clean.returncode == 0, clean.stderr


def test_a_workload_whose_every_episode_aborted_fails_with_its_reasons(campaign_dir: Path
                                                                      ) -> None:
    """The client cannot reach its server (a wrong port): every episode aborts, and the
    run says why (one line per reason, at most 3) and exits 5, not 0."""
    (campaign_dir / "c.toml").write_text(CAMPAIGN.replace(
        'argv = ["python3", "client.py", "{addr:echo}", "7100"]',
        'argv = ["python3", "client.py", "{addr:echo}", "7199"]'))
    out = campaign_dir / "out"
    proc = _testbed("run", "c.toml", "--out", str(out), cwd=campaign_dir)
    assert proc.returncode == 5, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert all(line.startswith("testbed run: all 3 episodes aborted, nothing was measured; "
                               "reason (") for line in lines), lines
    assert "ConnectionRefusedError" in proc.stderr
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert episodes["aborted"].all()
