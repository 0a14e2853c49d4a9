"""Real daemons of a lab, on hosts that are network namespaces of this machine
(testbed.tools.lab_net): an sshd per host, munged, and a Slurm controller and compute
node. Everything lives in the lab's scratch directory, is started as a process the run's
ledger records by pid, and goes away with the ledger; nothing under /etc or /run is
written. Each daemon reads its own configuration from there (``SLURM_CONF`` for the Slurm
clients)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.host.ledger import Ledger
from testbed.tools.lab_net import Lab, LabHost, start_in_host
from tests.privileges import TUN_0666_ROOT

SSHD = "/usr/sbin/sshd"
DAEMONS = {"sshd": SSHD, "ssh": "ssh", "ssh-keygen": "ssh-keygen", "munged": "munged",
           "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "sbatch"}
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "ConnectTimeout=20")


def missing_daemons() -> list[str]:
    return [name for name, path in DAEMONS.items() if not shutil.which(path)]


def wait_for_port(host: LabHost, port: int, timeout_s: float = 60) -> None:
    """Until something listens on ``host``'s address:``port`` (asked from the host's own
    namespace)."""
    probe = ("import socket, sys, time\n"
             f"end = time.monotonic() + {timeout_s}\n"
             "while True:\n"
             "    try:\n"
             f"        socket.create_connection(({host.address!r}, {port}), timeout=2).close()\n"
             "        break\n"
             "    except OSError:\n"
             "        if time.monotonic() > end: sys.exit(1)\n"
             "        time.sleep(0.2)\n")
    done = subprocess.run(in_host(host, "python3", "-c", probe), timeout=timeout_s + 30,
                          check=False)
    assert done.returncode == 0, f"{host.name}: nothing listens on {host.address}:{port}"


def in_host(host: LabHost, *argv: str) -> list[str]:
    """``argv`` run inside ``host``'s namespace."""
    return [sys.executable, "-m", "testbed.tools.in_netns", host.netns, *argv]


# ----------------------------------------------------------------------------- ssh


@dataclass(frozen=True)
class Ssh:
    """A client key every lab sshd accepts for root."""

    key: Path

    def argv(self, host: LabHost, command: str) -> list[str]:
        return ["ssh", "-i", str(self.key), *SSH_OPTIONS, f"root@{host.address}", command]


def start_sshds(ledger: Ledger, lab: Lab, hosts: Sequence[LabHost], directory: Path) -> Ssh:
    """An sshd on port 22 of each host, root login by key only; the client key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "client_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True, timeout=60)
    (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    for host in hosts:
        host_key = directory / f"host_key_{host.name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)],
                       check=True, timeout=60)
        config = directory / f"sshd_{host.name}.conf"
        config.write_text(
            f"ListenAddress {host.address}\nPort 22\nHostKey {host_key}\n"
            f"PidFile {directory}/sshd_{host.name}.pid\n"
            f"AuthorizedKeysFile {directory}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PrintMotd no\nX11Forwarding no\n")
        with (directory / f"sshd_{host.name}.log").open("ab") as log:
            start_in_host(ledger, lab, host, [SSHD, "-D", "-e", "-f", str(config)], log=log)
        wait_for_port(host, 22)
    return Ssh(key)


# --------------------------------------------------------------------------- munge


def start_munged(ledger: Ledger, directory: Path) -> Path:
    """munged with a key of its own; its socket (a Unix socket: every namespace of this
    machine reaches it through the file system)."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = directory / "munge.socket"
    with (directory / "munged.out").open("ab") as log:
        proc = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={directory}/munged.pid", f"--log-file={directory}/munged.log",
             f"--seed-file={directory}/munged.seed"], stdout=log, stderr=subprocess.STDOUT)
    ledger.record_process(proc.pid)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, (directory / "munged.out").read_text()
        assert time.monotonic() < deadline, "munged opened no socket"
        time.sleep(0.1)
    return sock


# --------------------------------------------------------------------------- slurm


def slurm_conf(directory: Path, *, controller: LabHost, node: LabHost, munge: Path,
               cpus: int, memory_mb: int) -> Path:
    """A one-node cluster: the controller on ``controller``'s address (named as this
    machine, which slurmctld checks), the compute node ``node``."""
    for sub in ("state", "spool"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(
        f"ClusterName=tblab\nSlurmctldHost={socket.gethostname()}({controller.address})\n"
        "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
        f"AuthInfo=socket={munge}\n"
        f"StateSaveLocation={directory}/state\nSlurmdSpoolDir={directory}/spool\n"
        f"SlurmctldPidFile={directory}/slurmctld.pid\nSlurmdPidFile={directory}/slurmd.pid\n"
        f"SlurmctldLogFile={directory}/slurmctld.log\nSlurmdLogFile={directory}/slurmd.log\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\n"
        "ReturnToService=2\nSchedulerType=sched/builtin\nSlurmctldTimeout=30\n"
        "SlurmdTimeout=60\nKillWait=10\n"
        f"NodeName={node.name} NodeAddr={node.address} CPUs={cpus} RealMemory={memory_mb} "
        "State=UNKNOWN\n"
        f"PartitionName=lab Nodes={node.name} Default=YES MaxTime=INFINITE State=UP\n")
    return conf


def start_slurm(ledger: Ledger, lab: Lab, conf: Path, *, controller: LabHost,
                node: LabHost) -> None:
    """slurmctld on ``controller``, slurmd on ``node`` (its jobs see a 0666 TUN node);
    returns once the node is idle."""
    with (conf.parent / "slurmctld.out").open("ab") as log:
        start_in_host(ledger, lab, controller, ["slurmctld", "-D", "-f", str(conf)], log=log)
    wait_for_port(controller, 6817)
    with (conf.parent / "slurmd.out").open("ab") as log:
        start_in_host(ledger, lab, node, [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", TUN_0666_ROOT, "sh",
            "slurmd", "-D", "-f", str(conf), "-N", node.name], log=log)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    deadline = time.monotonic() + 120
    state = ""
    while True:
        done = subprocess.run(in_host(controller, "sinfo", "-h", "-N", "-o", "%T"), env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        state = done.stdout.strip()
        if state == "idle":
            return
        assert time.monotonic() < deadline, (
            f"slurm node {node.name} is {state!r}, not idle: {done.stderr}\n"
            + _tail(conf.parent / "slurmd.log") + _tail(conf.parent / "slurmctld.log"))
        time.sleep(1)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}\n"
    except OSError:
        return f"--- {path.name}: none\n"
