"""docs/cluster.md's Slurm recipe, as a lab user runs it from the host the jobs reach:
a dask-jobqueue ``SLURMCluster`` whose jobs (real ``sbatch``) start ``testbed worker``,
then ``testbed run --cluster`` against its scheduler, then the cluster closed. Prints one
JSON line: the scheduler address, the job script, the run's exit status.

Usage: python slurm_driver.py CONFIG.json (keys below, in ``main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def main(path: str) -> int:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    from testbed.run.cluster_security import cluster_access

    config = json.loads(Path(path).read_text())
    security = cluster_access(config=config["client_config"]).security()
    cluster = SLURMCluster(
        cores=config["cores"], processes=1, memory="2GiB", walltime="00:30:00",
        python=config["python"], worker_command="testbed worker",
        worker_extra_args=["--interface", config["worker_interface"]],
        death_timeout=120, security=security, log_directory=config["job_logs"],
        local_directory=config["job_dir"],
        job_extra_directives=[f"--uid={config['uid']}", f"--gid={config['uid']}",
                              f"--chdir={config['job_dir']}", "--export=NONE"],
        job_script_prologue=[f"export HOME={config['home']}", "export PATH=/usr/bin:/bin",
                             "export LANG=C.UTF-8"],
        scheduler_options={"interface": config["interface"],
                           "dashboard_address": "127.0.0.1:0"})
    try:
        cluster.scale(jobs=1)
        with Client(cluster, security=security) as client:
            client.wait_for_workers(1, timeout=config["wait_s"])
        run = subprocess.run(
            [config["testbed"], "run", config["campaign"], "--out", config["out"],
             "--cluster", cluster.scheduler_address,
             "--cluster-config", config["client_config"]],
            capture_output=True, text=True, timeout=config["wait_s"] * 4, check=False)
        print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
        print(json.dumps({"scheduler": cluster.scheduler_address,
                          "job_script": cluster.job_script(), "run_rc": run.returncode}))
        return 0
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
