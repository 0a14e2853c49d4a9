"""`testbed bench cluster` and its lab: hosts as network namespaces on one bridge, real
TCP between them, processes started inside them, host-wide sysctls written from the
machine's own namespace, and the bench's figures from a real scheduler and workers."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from testbed.host import kernel
from testbed.host.ledger import scratch_ledger
from testbed.tools.lab_net import open_lab, plan_lab, port_bytes, start_in_host
from tests.leftovers import prefix_objects

CC_KEY = "net.ipv4.tcp_allowed_congestion_control"


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab's namespaces need root")


def test_the_lab_plan_gives_each_host_its_own_namespace_and_address() -> None:
    lab = plan_lab("tbabc", ["sched", "worker0", "worker1"])
    assert [h.netns for h in lab.hosts] == ["tbabc-h0", "tbabc-h1", "tbabc-h2"]
    assert [h.address for h in lab.hosts] == ["198.18.255.1", "198.18.255.2", "198.18.255.3"]
    assert all(len(h.host_if) < 16 and len(h.bridge_if) < 16 for h in lab.hosts)
    assert lab.host("worker1").address == "198.18.255.3"
    with pytest.raises(ValueError, match="unique"):
        plan_lab("tbabc", ["a", "a"])


def test_in_netns_refuses_a_namespace_that_does_not_exist() -> None:
    _root()
    proc = subprocess.run([sys.executable, "-m", "testbed.tools.in_netns", "tbnone-x",
                           "true"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3
    assert proc.stderr.startswith("in_netns: cannot enter 'tbnone-x'")


_SERVE = ("import socket; s = socket.create_server(('{addr}', 9000)); c, _ = s.accept(); "
          "c.sendall(c.recv(100) * 1000); c.close()")
_ASK = ("import socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        c = socket.create_connection(('{addr}', 9000), timeout=5); break\n"
        "    except OSError: time.sleep(0.1)\n"
        "c.sendall(b'x' * 100); n = 0\n"
        "while (d := c.recv(65536)): n += len(d)\n"
        "print(n)")


@pytest.mark.privileged
def test_hosts_talk_tcp_over_the_bridge_and_everything_goes_away(tmp_path: Path) -> None:
    _root()
    with scratch_ledger() as ledger:
        prefix = ledger.prefix
        with open_lab(ledger, ["a", "b"]) as lab:
            a, b = lab.hosts
            before = port_bytes(lab)
            with (tmp_path / "serve.log").open("ab") as log:
                server = start_in_host(ledger, lab, b, [sys.executable, "-c",
                                                        _SERVE.format(addr=b.address)], log=log)
            ask = subprocess.run([sys.executable, "-m", "testbed.tools.in_netns", a.netns,
                                  sys.executable, "-c", _ASK.format(addr=b.address)],
                                 capture_output=True, text=True, timeout=60, check=True)
            assert server.wait(timeout=30) == 0
            ledger.forget_process(server.pid)
            assert ask.stdout.strip() == "100000"
            after = port_bytes(lab)
            sent_b = after["b"]["sent_bytes"] - before["b"]["sent_bytes"]
            assert 100_000 < sent_b < 200_000  # the reply, with headers, crossed the bridge
            assert after["a"]["received_bytes"] - before["a"]["received_bytes"] >= sent_b
            assert prefix_objects(prefix)  # it exists while open
        assert prefix_objects(prefix) == []
        assert f"{prefix}-machine" not in kernel.list_netns()


@pytest.mark.privileged
def test_a_process_in_a_lab_host_writes_host_wide_sysctls_from_the_machine(
        tmp_path: Path) -> None:
    """tcp_allowed_congestion_control is read-only outside the machine's own namespace;
    a process started in a lab host writes it through the lab's name for that namespace
    (here: its current value, so nothing changes)."""
    _root()
    script = ("import sys; from testbed.host import kernel; "
              f"kernel.write_root_sysctl({CC_KEY!r}, sys.argv[1]); print('wrote')")
    current = kernel.get_sysctl(None, CC_KEY)
    with scratch_ledger() as ledger, open_lab(ledger, ["a"]) as lab:
        host = lab.hosts[0]
        without = subprocess.run([sys.executable, "-m", "testbed.tools.in_netns", host.netns,
                                  sys.executable, "-c", script, current],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert without.returncode != 0
        assert "Permission denied" in without.stderr
        with (tmp_path / "with.log").open("ab") as log:
            proc = start_in_host(ledger, lab, host, [sys.executable, "-c", script, current],
                                 log=log)
            assert proc.wait(timeout=60) == 0, (tmp_path / "with.log").read_text()
            ledger.forget_process(proc.pid)
        assert (tmp_path / "with.log").read_text().strip() == "wrote"
    assert kernel.get_sysctl(None, CC_KEY) == current


@pytest.mark.slow
@pytest.mark.privileged
def test_the_bench_runs_a_campaign_on_worker_hosts_with_tls(tmp_path: Path) -> None:
    _root()
    if not os.path.exists(kernel.TUN_PATH):
        pytest.skip("a fixed link needs /dev/net/tun")
    from testbed.tools.bench_cluster import bench_cluster

    result = bench_cluster(tmp_path / "bench.json", Console(file=io.StringIO()),
                           workers=(2,), templates=2, units=4, keep=tmp_path / "runs")
    local, row = result["local"], result["cluster"]["2"]
    assert local["episodes"] == row["episodes"] == 4
    assert local["aborted"] == row["aborted"] == 0
    assert row["paired"] == 4
    assert len(row["workers_seen"]) == 1  # one machine's host name, two worker hosts
    assert row["worker_to_lab_bytes_per_episode"] > 1000  # results crossed the lab
    assert row["controller_cpu_s_per_episode"] > 0
    assert row["privilege"] == ["root"]
    log = (tmp_path / "runs" / "w2-logs" / "worker1.log").read_text()
    assert "serving tls://198.18.255.1:8786" in log
    assert "listening at tls://198.18.255.1:8786" in (
        tmp_path / "runs" / "w2-logs" / "scheduler.log").read_text()
    assert (tmp_path / "bench.json").exists()
