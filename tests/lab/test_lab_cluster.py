"""docs/cluster.md followed on several hosts: the hosts are network namespaces of this
machine on one bridge (testbed.tools.lab_net), each with its own address and real
daemons: an sshd per host for the SSH recipe, and munged, slurmctld and slurmd for the
Slurm recipe (dask-jobqueue submitting with the real ``sbatch``). Traffic between the
controller, the scheduler and the workers crosses the bridge over mutual TLS. What these
hosts share that a lab's do not: the kernel, the file system (so the "same checkout on
every host" holds by itself) and the host name.

Run by scripts/cluster-lab.sh, which installs the daemons (``TESTBED_LAB=1``)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from testbed.host.ledger import Ledger, scratch_ledger
from testbed.tools.certs import make_certs
from testbed.tools.lab_net import Lab, LabHost, open_lab, port_bytes, start_in_host
from tests.lab.daemons import (
    Ssh,
    in_host,
    missing_daemons,
    slurm_conf,
    start_munged,
    start_slurm,
    start_sshds,
)
from tests.privileges import NOBODY, TUN_0666
from tests.testbed.run.cluster_procs import BIN, WORLD_PYTHON, world_venv

PORT = 8786
CAMPAIGN = ('name = "lab-hosts"\nseed = 8\ntemplates = {templates}\n[options]\n'
            'episode_timeout_s = 180\n[grid]\npolicy = ["planfence"]\nnetwork = ["fixed"]\n'
            'agents = [2]\nkeys = [4]\nunits = [8]\nconnection = ["reuse"]\n')
EPISODE_BYTES_MIN = 5_000
"""Bytes a worker host sends into the lab for a unit at least (its outcome and the
dask traffic that carries it; docs/benchmarks.md measured about 25 KB per episode)."""


@pytest.fixture
def lab_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch directory every host and uid 65534 can read (the hosts share the file
    system; pytest's tmp_path is 0700); dask's scratch space of every process started
    from here is inside it."""
    missing = missing_daemons()
    assert not missing, f"the lab lane needs {missing}: run scripts/cluster-lab.sh"
    assert os.geteuid() == 0, "the lab lane runs as root (its hosts are namespaces)"
    path = Path(tempfile.mkdtemp(prefix="tb-lab-hosts-"))
    path.chmod(0o755)
    monkeypatch.setenv("DASK_TEMPORARY_DIRECTORY", str(path / "dask"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _certs(lab: Lab, directory: Path) -> Path:
    certs = directory / "certs"
    make_certs(certs, hosts=[h.address for h in lab.hosts])
    certs.chmod(0o755)
    for f in certs.iterdir():  # the rootless worker reads them (a shared FS in a lab)
        if f.name != "ca.key":
            f.chmod(0o644)
    return certs


def _wait_for(path: Path, text: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert time.monotonic() < deadline, f"{path.name}: no {text!r}:\n" + (
            path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)")
        time.sleep(0.5)


def _start_scheduler(ledger: Ledger, lab: Lab, host: LabHost, certs: Path,
                     directory: Path) -> str:
    log_path = directory / "scheduler.log"
    with log_path.open("ab") as log:
        start_in_host(ledger, lab, host, [
            str(BIN / "testbed"), "scheduler", "--listen", host.address, "--port", str(PORT),
            "--cluster-config", str(certs / "scheduler.toml")], log=log)
    _wait_for(log_path, "listening at")
    return f"tls://{host.address}:{PORT}"


def _ssh_worker(ledger: Ledger, ssh: Ssh, client: LabHost, host: LabHost, worker: list[str],
                directory: Path) -> int:
    """docs/cluster.md's ``ssh HOST 'nohup ... testbed worker ... &'`` from ``client``;
    the worker's pid (written by the remote shell), recorded in the ledger."""
    log, pid_file = directory / f"worker-{host.name}.log", directory / f"worker-{host.name}.pid"
    remote = (f"cd {shlex.quote(str(directory))} || exit 1; nohup {shlex.join(worker)} "
              f"> {shlex.quote(str(log))} 2>&1 < /dev/null & echo $! > {shlex.quote(str(pid_file))}")
    subprocess.run(in_host(client, *ssh.argv(host, remote)), check=True, timeout=60)
    pid = int(pid_file.read_text())
    ledger.record_process(pid)
    _wait_for(log, "worker: serving")
    return pid


def _stop(ledger: Ledger, pid: int) -> None:
    """SIGTERM (the nanny closes its worker), then wait for it to go."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not Path(f"/proc/{pid}").exists():
        ledger.forget_process(pid)


def _run_rows(out: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, pd.read_parquet(out / "episodes.parquet")


@pytest.mark.slow
@pytest.mark.privileged
@pytest.mark.timeout(1800)
def test_workers_started_over_ssh_on_two_hosts_run_a_shaped_campaign_over_tls(
        lab_dir: Path) -> None:
    """The SSH recipe: a TLS scheduler on one host, a worker started over SSH on each of
    two others (one as root, one dropping to uid 65534 where user namespaces and a usable
    TUN node exist), and a shaped campaign run from the first host; both workers run
    units and send their outcomes across the bridge."""
    python = world_venv(lab_dir)
    if python is None:
        pytest.skip(f"needs a /usr/bin/{WORLD_PYTHON} for the rootless worker")
    home = lab_dir / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    (lab_dir / "c.toml").write_text(CAMPAIGN.format(templates=6))
    with scratch_ledger() as ledger, open_lab(ledger, ["ctl", "h1", "h2"]) as lab:
        ctl, h1, h2 = lab.hosts
        certs = _certs(lab, lab_dir)
        ssh = start_sshds(ledger, lab, [h1, h2], lab_dir / "ssh")
        address = _start_scheduler(ledger, lab, ctl, certs, lab_dir)
        worker_args = [address, "--lanes", "1", "--cluster-config", str(certs / "worker.toml")]
        pids = [
            # a lab host's root namespace is its own; here host-wide sysctls go to the
            # machine's through the lab's name for it (testbed.tools.lab_net)
            _ssh_worker(ledger, ssh, ctl, h1, [
                "env", f"TESTBED_HOST_NETNS={lab.machine_netns}", str(BIN / "testbed"),
                "worker", *worker_args, "--listen", h1.address,
                "--local-directory", str(lab_dir / "scratch-h1")], lab_dir),
            _ssh_worker(ledger, ssh, ctl, h2, [
                "unshare", "--mount", "--propagation", "private", "sh", "-c", TUN_0666, "sh",
                "env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}", "LANG=C.UTF-8",
                str(python), "-m", "testbed", "worker", *worker_args, "--listen", h2.address,
                "--local-directory", str(home / "scratch")], lab_dir)]
        try:
            before = port_bytes(lab)
            run = subprocess.run(in_host(ctl, str(BIN / "testbed"), "run", str(lab_dir / "c.toml"),
                                     "--out", str(lab_dir / "out"), "--cluster", address,
                                     "--cluster-config", str(certs / "client.toml")),
                                 cwd=lab_dir, capture_output=True, text=True, timeout=1800,
                                 check=False)
            after = port_bytes(lab)
        finally:
            for pid in pids:
                _stop(ledger, pid)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    manifest, episodes = _run_rows(lab_dir / "out")
    workers = manifest["execution"]["workers"]
    assert sorted(w["privilege"] for w in workers.values()) == ["root", "userns"]
    assert {w["uid"] for w in workers.values()} == {0, NOBODY}
    assert all(key.startswith(("tls://198.18.255.2:", "tls://198.18.255.3:")) for key in workers)
    assert len(episodes) == 6
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    for host in (h1, h2):  # each worker host ran units: their outcomes crossed the bridge
        sent = after[host.name]["sent_bytes"] - before[host.name]["sent_bytes"]
        assert sent > EPISODE_BYTES_MIN, (host.name, sent)


@pytest.mark.slow
@pytest.mark.privileged
@pytest.mark.timeout(1800)
def test_slurm_jobs_submitted_by_dask_jobqueue_run_a_campaign_without_root(
        lab_dir: Path) -> None:
    """The Slurm recipe: munged, slurmctld on the controller host, slurmd on a compute
    host; dask-jobqueue's SLURMCluster submits a job with ``sbatch --uid 65534`` whose
    command is ``testbed worker``; the job's worker runs the campaign's shaped units in
    user namespaces, and the cluster's close cancels the job."""
    python = world_venv(lab_dir)
    if python is None:
        pytest.skip(f"needs a /usr/bin/{WORLD_PYTHON} for the job's worker")
    home, jobs = lab_dir / "home", lab_dir / "jobs"
    for d in (home, jobs):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    (lab_dir / "c.toml").write_text(CAMPAIGN.format(templates=2))
    with scratch_ledger() as ledger, open_lab(ledger, ["ctl", "node1"]) as lab:
        ctl, node = lab.hosts
        certs = _certs(lab, lab_dir)
        munge = start_munged(ledger, lab_dir / "munge")
        conf = slurm_conf(lab_dir / "slurm", controller=ctl, node=node, munge=munge, cpus=2,
                          memory_mb=4096)
        start_slurm(ledger, lab, conf, controller=ctl, node=node)
        config = lab_dir / "driver.json"
        config.write_text(json.dumps({
            "client_config": str(certs / "client.toml"), "cores": 2, "python": str(python),
            "worker_interface": node.host_if, "interface": ctl.host_if, "uid": NOBODY,
            "job_dir": str(home), "job_logs": str(jobs), "home": str(home), "wait_s": 300,
            "testbed": str(BIN / "testbed"), "campaign": str(lab_dir / "c.toml"),
            "out": str(lab_dir / "out")}))
        driver = subprocess.run(
            in_host(ctl, sys.executable, str(Path(__file__).with_name("slurm_driver.py")),
                str(config)), cwd=lab_dir, capture_output=True, text=True, timeout=2400,
            check=False, env={**os.environ, "SLURM_CONF": str(conf),
                              "PYTHONPATH": str(Path(__file__).parents[2])})
        job_logs = "".join(p.read_text(errors="replace")[-2000:] for p in jobs.iterdir())
        assert driver.returncode == 0, driver.stderr[-4000:] + job_logs
        report = json.loads(driver.stdout.strip().splitlines()[-1])
        assert report["run_rc"] == 0, driver.stderr[-4000:] + job_logs
        assert f"--uid={NOBODY}" in report["job_script"]
        assert report["scheduler"].startswith(f"tls://{ctl.address}:")
        # the close cancelled the job: the node is idle again, no job is left
        deadline = time.monotonic() + 120
        while True:
            queue = subprocess.run(in_host(ctl, "squeue", "-h", "-o", "%i %u %T"),
                                   capture_output=True, text=True, timeout=60, check=False,
                                   env={**os.environ, "SLURM_CONF": str(conf)})
            if not queue.stdout.strip() or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert queue.stdout.strip() == "", queue.stdout
    manifest, episodes = _run_rows(lab_dir / "out")
    [summary] = manifest["execution"]["workers"].values()
    assert (summary["privilege"], summary["uid"]) == ("userns", NOBODY)
    assert len(episodes) == 2
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    group = next(iter(manifest["groups"].values()))
    assert group["privilege"] == "userns"
