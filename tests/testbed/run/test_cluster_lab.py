"""A cluster as a lab runs it (docs/cluster.md): real `testbed scheduler`, `testbed
worker` and `dask worker` processes. Loopback-only binds, mutual TLS that refuses a
client without a certificate, a lost scheduler reported in one line and resumed, and
workers started from dask-jobqueue's own Slurm job scripts."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import trio

from testbed.campaign.model import episode_key
from testbed.campaign.parse import parse_campaign
from testbed.errors import HostError, UserError
from testbed.host import kernel
from testbed.results.rundir import RunDir
from testbed.run.cluster_security import (
    ClusterAccess,
    check_listen,
    check_peer,
    cluster_access,
    load_cluster_config,
)
from testbed.run.dask_engine import open_dask_engine
from testbed.run.loop import run_campaign
from testbed.run.resume import resume_argv
from testbed.tools.certs import make_certs
from tests.privileges import TUN_0666
from tests.testbed.run.cluster_procs import (
    BIN,
    WORLD_PYTHON,
    free_port,
    listening,
    processes,
    world_venv,
)
from tests.testbed.run.fake_runner import quiet

LOOPBACK: dict[str, Any] = {
    "name": "lab-loopback", "seed": 3, "templates": 1,
    "options": {"episode_timeout_s": 120, "durability": "normal"},
    "grid": {"policy": ["planfence"], "network": ["loopback"], "agents": [2], "keys": [2],
             "units": [6], "connection": ["reuse"]},
}
SLOW_TOML = ('name = "lab-slow"\nseed = 4\ntemplates = 3\n[options]\nepisode_timeout_s = 120\n'
             '[grid]\npolicy = ["planfence", "batched_all_key"]\nnetwork = ["fixed"]\n'
             'agents = [2]\nkeys = [2]\nunits = [24]\nconnection = ["fresh"]\n')


def _root(tun: bool = False) -> None:
    if os.geteuid() != 0:
        pytest.skip("a testbed worker's host check and shaped units need root here")
    if tun and not os.path.exists(kernel.TUN_PATH):
        pytest.skip("a fixed link needs /dev/net/tun")


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    make_certs(tmp_path / "certs", hosts=["127.0.0.1"])
    return tmp_path / "certs"


def _access(certs: Path, role: str) -> ClusterAccess:
    return cluster_access(config=str(certs / f"{role}.toml"))


# ------------------------------------------------------------------ the rules, pure


def test_plain_tcp_beyond_loopback_needs_insecure_and_warns() -> None:
    plain = ClusterAccess()
    assert check_peer("tcp://127.0.0.1:8786", plain, what="cluster") == []
    with pytest.raises(UserError, match=r"^cluster: tcp://10\.0\.0\.1:8786 is plain tcp:// to "
                                        r"another host .* or pass --insecure$"):
        check_peer("tcp://10.0.0.1:8786", plain, what="cluster")
    warnings = check_peer("tcp://sched.lab:8786", ClusterAccess(insecure=True), what="cluster")
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: tcp://sched.lab:8786 is plain tcp://")
    with pytest.raises(UserError, match="is a tls:// address; give --tls-ca-file"):
        check_peer("tls://10.0.0.1:8786", plain, what="cluster")
    with pytest.raises(UserError, match=r"listening on 0\.0\.0\.0 without TLS"):
        check_listen("0.0.0.0", plain, what="worker")
    assert check_listen("127.0.0.1", plain, what="worker") == []


def test_certificates_and_their_config_file(certs: Path, tmp_path: Path) -> None:
    assert oct((certs / "ca.key").stat().st_mode & 0o777) == "0o600"
    config = load_cluster_config(certs / "worker.toml")
    assert config == {"tls_ca_file": str(certs / "ca.pem"), "tls_cert": str(certs / "worker.pem"),
                      "tls_key": str(certs / "worker.key")}
    access = cluster_access(config=str(certs / "worker.toml"))
    assert access.tls
    assert access.security().require_encryption
    # flags override the file; a half-given TLS is refused naming the missing flag
    assert cluster_access(config=str(certs / "worker.toml"),
                          tls_cert=str(certs / "client.pem")).tls_cert == str(certs / "client.pem")
    with pytest.raises(UserError, match=r"^--tls-key: missing"):
        cluster_access(tls_ca_file=str(certs / "ca.pem"), tls_cert=str(certs / "client.pem"))
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\ntls_ca = "x"\n')
    with pytest.raises(UserError, match=r"^cluster\.tls_ca in .* is not allowed; allowed: "):
        load_cluster_config(bad)
    with pytest.raises(UserError, match=r"exists; pass --force"):
        make_certs(certs)
    make_certs(certs, force=True)  # new role certificates from the same CA


def test_resume_commands_keep_the_run_and_drop_the_cluster_for_a_local_resume() -> None:
    argv = ["run", "c.toml", "--cluster", "tls://10.0.0.1:8786", "--cluster-config=l.toml",
            "--insecure", "--jobs", "2"]
    assert resume_argv(argv, Path("out"), local=False) == [
        "testbed", *argv, "--out", "out", "--resume"]
    assert resume_argv(argv, Path("out"), local=True) == [
        "testbed", "run", "c.toml", "--jobs", "2", "--out", "out", "--resume"]


# ------------------------------------------------------- real schedulers and workers


def _handshake(certs: Path, port: int, *, certificate: bool) -> None:
    """A TLS 1.2 handshake with the listener (in 1.2 the server checks the client's
    certificate inside the handshake; in 1.3 only after it)."""
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.check_hostname = False
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    if certificate:
        context.load_cert_chain(certs / "client.pem", certs / "client.key")
    with socket.create_connection(("127.0.0.1", port)) as raw, context.wrap_socket(raw):
        pass


@pytest.mark.slow
def test_tls_is_required_and_a_client_without_a_certificate_is_refused(
        tmp_path: Path, certs: Path) -> None:
    _root()
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    other = tmp_path / "other-ca"
    make_certs(other)
    with processes(tmp_path) as procs:
        procs.start("scheduler", [str(BIN / "testbed"), "scheduler", "--port", str(port),
                                  "--cluster-config", str(certs / "scheduler.toml")])
        procs.wait_for_log("scheduler", f"listening at {address}")
        procs.start("worker", [str(BIN / "testbed"), "worker", address, "--cluster-config",
                               str(certs / "worker.toml"), "--loopback-only"])
        procs.wait_for_log("worker", "worker: serving")
        from distributed import Client

        with pytest.raises(OSError, match=r"Connection reset|closed"):  # plain tcp to TLS
            Client(f"tcp://127.0.0.1:{port}", timeout=5)
        _handshake(certs, port, certificate=True)  # the same handshake with one: accepted
        with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
            _handshake(certs, port, certificate=False)
        with pytest.raises(OSError, match="certificate"):  # a certificate of another lab's CA
            Client(address, timeout=5, security=_access(other, "client").security())
        with Client(address, timeout=30, security=_access(certs, "client").security()) as c:
            workers = c.scheduler_info()["workers"]
            assert len(workers) == 1
            assert all(w.startswith("tls://127.0.0.1:") for w in workers)
            assert next(iter(workers.values()))["resources"] == {"lanes": 1}


@pytest.mark.slow
async def test_everything_the_testbed_starts_listens_on_loopback_only(tmp_path: Path) -> None:
    _root()
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    with processes(tmp_path) as procs:
        scheduler = procs.start("scheduler", [str(BIN / "testbed"), "scheduler", "--port",
                                              str(port)])
        procs.wait_for_log("scheduler", f"listening at {address}")
        worker = procs.start("worker", [str(BIN / "testbed"), "worker", address, "--lanes",
                                        "2", "--loopback-only"])
        procs.wait_for_log("worker", "worker: serving")
        async with open_dask_engine("local:1") as engine:
            local_pids = await trio.to_thread.run_sync(
                lambda: list(engine.client.run(os.getpid).values()))
            sockets = {"scheduler": listening(scheduler.pid), "worker": listening(worker.pid),
                       "local:1": listening(os.getpid()) + [
                           s for pid in local_pids for s in listening(int(pid))]}
    for who, found in sockets.items():
        assert found, f"{who}: no listening socket found"
        assert {ip for ip, _ in found} == {"127.0.0.1"}, (who, found)


def _slow_campaign(tmp_path: Path) -> Path:
    path = tmp_path / "slow.toml"
    path.write_text(SLOW_TOML)
    return path


@pytest.mark.slow
def test_a_lost_scheduler_is_one_line_and_resume_finishes_without_duplicates(
        tmp_path: Path, certs: Path) -> None:
    _root(tun=True)
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    campaign = _slow_campaign(tmp_path)
    scheduler_cmd = [str(BIN / "testbed"), "scheduler", "--port", str(port),
                     "--cluster-config", str(certs / "scheduler.toml")]
    with processes(tmp_path) as procs:
        procs.start("scheduler", scheduler_cmd)
        procs.wait_for_log("scheduler", "listening at")
        procs.start("worker", [str(BIN / "testbed"), "worker", address, "--cluster-config",
                               str(certs / "worker.toml"), "--lanes", "1",
                               "--death-timeout", "120"])
        procs.wait_for_log("worker", "worker: serving")
        argv = ["run", str(campaign), "--out", "out", "--cluster", address,
                "--cluster-config", str(certs / "client.toml")]
        run = procs.start("run", [str(BIN / "testbed"), *argv])
        out = tmp_path / "out"
        deadline = time.monotonic() + 400
        while not RunDir(out).completed():
            assert run.poll() is None, procs.log("run")
            assert time.monotonic() < deadline, "no episode finished"
            time.sleep(0.5)
        procs.stop("scheduler", signal.SIGKILL)  # mid-run: the next unit is running
        assert run.wait(timeout=120) == 3, procs.log("run")
        lines = [line for line in procs.log("run").splitlines() if line.startswith("testbed run:")]
        assert len(lines) == 1, procs.log("run")[-3000:]
        assert "Traceback" not in procs.log("run")
        line = lines[0]
        finished = len(RunDir(out).completed())
        assert f"lost the scheduler at {address}" in line
        assert f"after {finished} of 6 episodes finished; out is consistent" in line
        resume = line.split("resume with `", 1)[1].split("`", 1)[0]
        assert shlex.split(resume) == ["testbed", *argv, "--resume"]
        assert "or here with `testbed run " in line
        # the scheduler comes back on its address; the worker finds it again
        procs.start("scheduler", scheduler_cmd)
        procs.wait_for_log("worker", "waiting for it to come back")
        deadline = time.monotonic() + 120
        while procs.log("worker").count("worker: serving") < 2:
            assert time.monotonic() < deadline, procs.log("worker")[-3000:]
            time.sleep(0.5)
        again = subprocess.run([str(BIN / "testbed"), *shlex.split(resume)[1:]], cwd=tmp_path,
                               capture_output=True, text=True, timeout=600, check=False)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    episodes = pd.read_parquet(out / "episodes.parquet")
    expected = sorted(episode_key(c, t) for c, t in parse_campaign(
        __import__("tomllib").loads(SLOW_TOML)).episodes())
    assert sorted(episodes["episode"]) == expected  # each once
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    actions = pd.read_parquet(out / "actions.parquet")
    assert not actions.duplicated(["episode", "action"]).any()


# --------------------------------------------------------- dask-jobqueue's job scripts


def _job_command(script: str) -> list[str]:
    """The worker command of a job script (its last non-comment line)."""
    lines = [ln for ln in script.splitlines() if ln.strip() and not ln.startswith("#")]
    return shlex.split(lines[-1])


@pytest.mark.slow
async def test_a_slurm_job_script_starts_a_testbed_worker_that_runs_units(
        tmp_path: Path, certs: Path) -> None:
    """dask-jobqueue's SLURMCluster with the testbed as its worker command, TLS on: its
    job script's command parses as `testbed worker`, and run by bash (as Slurm would)
    it joins the cluster and runs a campaign's units."""
    _root()
    from dask_jobqueue import SLURMCluster

    from testbed.cli import build_parser

    security = _access(certs, "client").security()
    cluster = await trio.to_thread.run_sync(lambda: SLURMCluster(
        cores=2, processes=1, memory="4GiB", worker_command="testbed worker",
        death_timeout=60, security=security, scheduler_options={
            "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        python=str(BIN / "python")))
    try:
        script = cluster.job_script()
        command = _job_command(script)
        assert command[:4] == [str(BIN / "python"), "-m", "testbed", "worker"]
        args = build_parser().parse_args(command[3:])  # the testbed's own parser
        assert isinstance(args, argparse.Namespace)
        assert (args.nthreads, args.memory_limit, args.death_timeout) == (2, "4.00GiB", 60.0)
        assert args.tls_cert
        assert args.scheduler == cluster.scheduler_address
        assert args.scheduler.startswith("tls://127.0.0.1:")
        (tmp_path / "job.sh").write_text(script)
        with processes(tmp_path) as procs:
            procs.start("job", ["bash", str(tmp_path / "job.sh")])
            procs.wait_for_log("job", "worker: serving")
            async with open_dask_engine(cluster.scheduler_address,
                                        access=_access(certs, "client")) as engine:
                campaign = parse_campaign(LOOPBACK)
                await engine.survey(campaign)
                [(_, summary)] = engine.workers.items()
                assert summary["privilege"] == "root"
                resources = await trio.to_thread.run_sync(
                    lambda: engine.client.scheduler_info()["workers"])
                assert [w["resources"] for w in resources.values()] == [{"lanes": 2}]
                await run_campaign(campaign, tmp_path / "out", resume=False,
                                   console=quiet(), engine=engine)
    finally:
        await trio.to_thread.run_sync(cluster.close)
    episodes = pd.read_parquet(tmp_path / "out" / "episodes.parquet")
    assert len(episodes) == 1
    assert not episodes["aborted"].any()


@pytest.mark.slow
def test_a_stock_dask_worker_with_the_preload_declares_lanes(tmp_path: Path,
                                                             certs: Path) -> None:
    """The Dask idiom: dask-jobqueue's default worker command (`dask worker`) with
    `--preload testbed.tools.worker_preload`; the preload checks the host and gives the
    worker one lane per thread."""
    _root()
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    security = _access(certs, "client").security()
    cluster = SLURMCluster(
        cores=3, processes=1, memory="2GiB", death_timeout=60, security=security,
        worker_extra_args=["--host", "127.0.0.1", "--preload", "testbed.tools.worker_preload"],
        scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        python=str(BIN / "python"))
    try:
        script = cluster.job_script()
        assert "-m distributed.cli.dask_worker" in script
        (tmp_path / "job.sh").write_text(script)
        with processes(tmp_path) as procs, Client(cluster.scheduler_address,
                                                  security=security, timeout=30) as client:
            procs.start("job", ["bash", str(tmp_path / "job.sh")])
            client.wait_for_workers(1, timeout=120)
            workers = client.scheduler_info()["workers"]
            assert [w["resources"] for w in workers.values()] == [{"lanes": 3}]
            assert "testbed worker: 3 lane(s)" in procs.log("job")
    finally:
        cluster.close()


def test_a_worker_refuses_a_remote_scheduler_it_could_not_be_reached_from() -> None:
    from testbed.tools.worker import WorkerOptions

    options = WorkerOptions("tls://10.0.0.1:8786", access=ClusterAccess("ca", "c", "k"))
    with pytest.raises(HostError, match=r"would listen on 127\.0\.0\.1 only; give --listen"):
        options.check()
    assert WorkerOptions("tls://10.0.0.1:8786", listen="10.0.0.2",
                         access=ClusterAccess("ca", "c", "k")).check() == []


# ------------------------------------------------------------- a worker without root

_ROOTLESS_TOML = ('name = "lab-rootless"\nseed = 6\ntemplates = 1\n[options]\n'
                  'episode_timeout_s = 120\n[grid]\npolicy = ["planfence"]\n'
                  'network = ["fixed"]\nagents = [2]\nkeys = [4]\nunits = [8]\n'
                  'connection = ["reuse"]\n')


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A scratch directory uid 65534 can reach (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="tb-lab-rootless-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.privileged
def test_a_worker_without_root_runs_a_shaped_unit_in_a_user_namespace(
        shared_dir: Path) -> None:
    """`testbed worker` as uid 65534 on a host where users may create user namespaces
    and open /dev/net/tun: here a private mount namespace gives the worker a 0666 TUN
    node (this host's own is 0600), and a venv on /usr/bin/python3 with this checkout's
    packages (the checkout's interpreter lives under /root). The client is root; the
    unit's topology runs in a user namespace of the worker's."""
    _root(tun=True)
    if not all(shutil.which(t) for t in ("unshare", "mknod", "setpriv", "mount")):
        pytest.skip("needs unshare, mknod, setpriv and mount")
    if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
        pytest.skip("no unprivileged user namespaces here")
    python = world_venv(shared_dir)
    if python is None:
        pytest.skip(f"needs a /usr/bin/{WORLD_PYTHON}")
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    campaign = shared_dir / "c.toml"
    campaign.write_text(_ROOTLESS_TOML)
    with processes(shared_dir) as procs:
        procs.start("scheduler", [str(BIN / "testbed"), "scheduler", "--port", str(port)])
        procs.wait_for_log("scheduler", "listening at")
        procs.start("worker", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", TUN_0666, "sh",
            "env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}", "LANG=C.UTF-8",
            str(python), "-m", "testbed", "worker", address, "--lanes", "1",
            "--local-directory", str(home / "dask")],  # env -i drops the suite's
            cwd=home)
        procs.wait_for_log("worker", "worker: serving")
        assert "backend auto -> rootless (a user namespace per unit)" in procs.log("worker")
        run = subprocess.run([str(BIN / "testbed"), "run", str(campaign), "--out", "out",
                              "--cluster", address], cwd=shared_dir, capture_output=True,
                             text=True, timeout=600, check=False)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    out = shared_dir / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    [summary] = manifest["execution"]["workers"].values()
    assert summary["privilege"] == "userns"
    assert summary["uid"] == 65534
    episodes = pd.read_parquet(out / "episodes.parquet")
    assert len(episodes) == 1
    assert not episodes["aborted"].any(), episodes["abort_reason"].tolist()
    group = next(iter(manifest["groups"].values()))
    assert group["privilege"] == "userns"
