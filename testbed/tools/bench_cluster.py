"""`testbed bench cluster`: a campaign on a scheduler and W workers, each on a "host" of
its own (a network namespace with its own address on one bridge), against a local run.

Rules:

- The hosts are ``testbed.tools.lab_net``'s: real TCP between them, mutual TLS with
  certificates from ``testbed cluster certs`` (the lab's addresses in them), a
  `testbed scheduler` on host ``sched`` listening on its lab address, and per worker
  host one `testbed worker --lanes L` listening on its own. The controller, `testbed
  run --cluster tls://...`, runs on the scheduler's host (as with dask-jobqueue), so
  every unit's results cross the lab from a worker host.
- Every host shares this machine's CPUs: the figures say what the cluster path costs
  (start-up, per-unit overhead, bytes between hosts, the controller's and scheduler's
  CPU per episode) and whether fidelity holds, not how W real machines scale.
- The same campaign (a ``fixed`` network, two policies, one unit per template) runs
  first locally (L lanes in this process, as `testbed bench lanes` runs them, cut into
  the same units as on a cluster: a topology per template) and then on W = 1,
  2, 4 workers. For each run: wall time of the `testbed run` process (its start-up and
  the workers' survey included), episodes per hour, per-unit overhead against the
  local run, controller CPU per episode (its own rusage), scheduler CPU per unit,
  bytes between hosts per episode (the bridge ports' counters), the emulator's release
  lateness (episode p99s: median and max) and the paired stall ratio against the local
  run (median, range). Aborted episodes are counted; a run with any fails the bench.
- Everything it creates (namespaces, links, processes) is recorded in a scratch ledger
  first and removed at the end; processes are stopped by pid.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import trio
from rich.console import Console

from testbed.campaign.parse import parse_campaign
from testbed.errors import RunFailure
from testbed.host.ledger import Ledger, scratch_ledger
from testbed.run.engines import LocalEngine
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
from testbed.tools.certs import make_certs
from testbed.tools.lab_net import Lab, open_lab, port_bytes, start_in_host

WORKERS = (1, 2, 4)
POLICIES = ("planfence", "batched_all_key")
LATE_COLUMN = "emulator_late_p99_ms"
PORT = 8786
START_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 1800.0
TESTBED = str(Path(sys.executable).parent / "testbed")


def bench_campaign(templates: int, units: int) -> dict[str, Any]:
    return {"name": "bench-cluster", "seed": 23, "templates": templates,
            "options": {"episode_timeout_s": 300},
            "grid": {"policy": list(POLICIES), "network": ["fixed"], "agents": [2],
                     "keys": [4], "units": [units], "connection": ["reuse"]}}


def _toml(raw: dict[str, Any]) -> str:
    """The bench campaign as TOML (scalars, and tables of scalars and lists)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    for table, values in raw.items():
        if isinstance(values, dict):
            lines += ["", f"[{table}]", *(f"{k} = {json.dumps(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RunFailure(f"bench cluster: no {text!r} from {log.name} (exit "
                             f"{proc.returncode}): {log.read_text(errors='replace')[-1500:]}")
        time.sleep(0.3)


def _stop(ledger: Ledger, proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ledger.forget_process(proc.pid)


def _client(ledger: Ledger, argv: Sequence[str], log: Path, *, lab: Lab,
            cwd: Path) -> tuple[float, float]:
    """Run `testbed run ...` to its end; (wall s, its own CPU s from rusage)."""
    with log.open("ab") as out:
        t0 = time.monotonic()
        proc = start_in_host(ledger, lab, lab.host("sched"), argv, log=out, cwd=str(cwd))
        deadline = t0 + RUN_TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                _stop(ledger, proc)
                raise RunFailure(f"bench cluster: {log.name} ran over {RUN_TIMEOUT_S:g} s")
            time.sleep(0.2)
        wall_s = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        ledger.forget_process(proc.pid)
    if proc.returncode != 0:
        raise RunFailure(f"bench cluster: {' '.join(argv[:2])} exited {proc.returncode}: "
                         f"{log.read_text(errors='replace')[-2000:]}")
    return wall_s, usage.ru_utime + usage.ru_stime


async def _local_run(raw: dict[str, Any], out: Path, lanes: int) -> float:
    """The campaign in this process with ``lanes`` local lanes (as `testbed bench lanes`
    runs it: outside the host's lane coordination); its wall seconds."""
    campaign = parse_campaign(raw, source="bench cluster")
    engine = LocalEngine(EpisodeRunner(campaign, shared_emulator=True), jobs=lanes)
    engine.per_template = True  # the cluster's units: a topology per (group, template)
    t0 = time.monotonic()
    await run_campaign(campaign, out, resume=False, console=Console(file=io.StringIO()),
                       engine=engine)
    return time.monotonic() - t0


def _cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """A live process's own CPU seconds (user + system, /proc/PID/stat)."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _row(out: Path, wall_s: float, units: int) -> dict[str, Any]:
    episodes = pd.read_parquet(out / "episodes.parquet")
    done = episodes[~episodes["aborted"]]
    late = done[LATE_COLUMN].dropna() if LATE_COLUMN in done else pd.Series(dtype=float)
    return {"episodes": len(episodes), "units": units,
            "aborted": int(episodes["aborted"].sum()), "wall_s": round(wall_s, 1),
            "episodes_per_hour": round(len(episodes) / wall_s * 3600, 1),
            "emulator_late_p99_ms_median": None if late.empty else round(late.median(), 3),
            "emulator_late_p99_ms_max": None if late.empty else round(late.max(), 3),
            "workers_seen": sorted(set(episodes["worker"].astype(str))),
            "_stall": done.set_index("episode")["stall_ms_per_action"]}


def _paired(stall: pd.Series, reference: pd.Series) -> dict[str, Any]:
    both = pd.concat([stall, reference], axis=1, join="inner").dropna()
    if both.empty:
        return {"paired_stall_ratio_median": None, "paired": 0}
    ratio = both.iloc[:, 0] / both.iloc[:, 1]
    return {"paired_stall_ratio_median": round(float(ratio.median()), 4),
            "paired_stall_ratio_min": round(float(ratio.min()), 4),
            "paired_stall_ratio_max": round(float(ratio.max()), 4), "paired": len(both)}


def _cluster_run(ledger: Ledger, tmp: Path, campaign: Path, count: int, lanes: int,
                 units: int) -> dict[str, Any]:
    certs = tmp / "certs"
    names = ["sched", *(f"worker{i}" for i in range(count))]
    with open_lab(ledger, names) as lab:
        sched = lab.host("sched")
        address = f"tls://{sched.address}:{PORT}"
        logs = tmp / f"w{count}-logs"
        logs.mkdir()
        with (logs / "scheduler.log").open("ab") as log:
            scheduler = start_in_host(ledger, lab, sched, [
                TESTBED, "scheduler", "--listen", sched.address, "--port", str(PORT),
                "--cluster-config", str(certs / "scheduler.toml")], log=log, cwd=str(tmp))
        workers = []
        try:
            _wait_for(logs / "scheduler.log", "listening at", scheduler)
            for host in lab.hosts[1:]:
                with (logs / f"{host.name}.log").open("ab") as log:
                    workers.append((host, start_in_host(ledger, lab, host, [
                        TESTBED, "worker", address, "--listen", host.address, "--lanes",
                        str(lanes), "--death-timeout", "60", "--cluster-config",
                        str(certs / "worker.toml")], log=log, cwd=str(tmp))))
            for host, proc in workers:
                _wait_for(logs / f"{host.name}.log", "worker: serving", proc)
            bytes0, sched0 = port_bytes(lab), _cpu_s(scheduler)
            out = tmp / f"workers-{count}"
            wall_s, client_cpu_s = _client(ledger, [
                TESTBED, "run", str(campaign), "--out", str(out), "--cluster", address,
                "--cluster-config", str(certs / "client.toml")], logs / "client.log",
                lab=lab, cwd=tmp)
            bytes1, sched1 = port_bytes(lab), _cpu_s(scheduler)
        finally:
            for _, proc in workers:
                _stop(ledger, proc)
            _stop(ledger, scheduler)
    row = _row(out, wall_s, units)
    episodes = max(row["episodes"], 1)
    sent = sum(bytes1[h.name]["sent_bytes"] - bytes0[h.name]["sent_bytes"]
               for h in lab.hosts[1:])
    received = sum(bytes1[h.name]["received_bytes"] - bytes0[h.name]["received_bytes"]
                   for h in lab.hosts[1:])
    manifest = json.loads((out / "manifest.json").read_text())
    row.update({
        "workers": count, "lanes_per_worker": lanes,
        "controller_cpu_s_per_episode": round(client_cpu_s / episodes, 3),
        "scheduler_cpu_s_per_unit": round((sched1 - sched0) / max(units, 1), 4),
        "worker_to_lab_bytes_per_episode": round(sent / episodes),
        "lab_to_worker_bytes_per_episode": round(received / episodes),
        "recovery": manifest["sessions"][-1]["execution"].get("recovery"),
        "privilege": sorted({w.get("privilege", "") for w in
                             manifest["execution"]["workers"].values()})})
    return row


def bench_cluster(json_path: Path | None, console: Any, *,
                  workers: Sequence[int] = WORKERS, lanes: int = 1,
                  templates: int = 8, units: int = 12, keep: Path | None = None,
                  ) -> dict[str, Any]:
    """The bench (module rules); ``keep``: a directory for the runs and logs instead of
    a temporary one."""
    raw = bench_campaign(templates, units)
    campaign_units = len({(cell.group_key, t) for cell, t in
                          parse_campaign(raw, source="bench cluster").episodes()})
    result: dict[str, Any] = {"campaign": raw, "units": campaign_units,
                              "lanes_per_worker": lanes, "local": {}, "cluster": {},
                              "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="tb-bench-cluster-") as name, \
            scratch_ledger() as ledger:
        tmp = Path(keep) if keep is not None else Path(name)
        tmp.mkdir(parents=True, exist_ok=True)
        campaign = tmp / "bench-cluster.toml"
        campaign.write_text(_toml(raw))
        make_certs(tmp / "certs", hosts=[f"198.18.255.{i + 1}" for i in range(max(workers) + 1)])
        wall_s = trio.run(_local_run, raw, tmp / "local", lanes)
        local = _row(tmp / "local", wall_s, campaign_units)
        reference = local.pop("_stall")
        result["local"] = local
        console.print(f"local, {lanes} lane(s): {local}", markup=False)
        for count in sorted(set(workers)):
            row = _cluster_run(ledger, tmp, campaign, count, lanes, campaign_units)
            row.update(_paired(row.pop("_stall"), reference))
            row["speedup_vs_local"] = round(local["wall_s"] / row["wall_s"], 2)
            if count == 1:  # one worker of L lanes against L local lanes: the cluster's cost
                row["overhead_s_per_unit"] = round(
                    (row["wall_s"] - local["wall_s"]) / campaign_units, 2)
            result["cluster"][str(count)] = row
            console.print(f"workers {count}: {row}", markup=False)
            if row["aborted"]:
                raise RunFailure(f"bench cluster: {row['aborted']} episodes aborted on "
                                 f"{count} worker(s); see the workers' logs")
    result["load_after"] = os.getloadavg()
    result["command"] = "sudo .venv/bin/testbed bench cluster --json FILE"
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    return result
