"""``api.run(cluster=..., tls=...)``, the path ``testbed run --cluster`` takes: the
documented example against a real ``testbed scheduler`` and ``testbed worker`` with
mutual TLS, and the one-line refusals naming ``cluster`` / ``tls`` (``--cluster`` on the
command line)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.errors import UserError
from testbed.tools.certs import make_certs
from tests.testbed.run.cluster_procs import BIN, free_port, processes

DOC = Path(__file__).resolve().parents[3] / "docs" / "python-api.md"
LOOPBACK: dict[str, Any] = {
    "name": "api-cluster", "seed": 3, "templates": 1,
    "grid": {"policy": "planfence", "network": "loopback", "agents": 2, "keys": 2,
             "units": 6, "connection": "reuse"},
}


def _example() -> str:
    text = DOC.read_text().split("## A campaign on a cluster", 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_documented_cluster_example_runs_on_a_tls_scheduler_and_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("a testbed worker's host check needs root here")
    make_certs(tmp_path / "certs", hosts=["127.0.0.1"])
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    code = _example()
    assert "tls://127.0.0.1:8786" in code
    with processes(tmp_path) as procs:
        procs.start("scheduler", [str(BIN / "testbed"), "scheduler", "--port", str(port),
                                  "--cluster-config", "certs/scheduler.toml"])
        procs.wait_for_log("scheduler", f"listening at {address}")
        procs.start("worker", [str(BIN / "testbed"), "worker", address, "--cluster-config",
                               "certs/worker.toml", "--loopback-only"])
        procs.wait_for_log("worker", "worker: serving")
        monkeypatch.chdir(tmp_path)
        exec(compile(code.replace(":8786", f":{port}"), str(DOC), "exec"), {})
    assert capsys.readouterr().out.splitlines()[-1] == "1 1"
    manifest = json.loads((tmp_path / "runs" / "lab" / "manifest.json").read_text())
    execution = manifest["execution"]  # the run's engine: the scheduler started above
    assert execution["engine"] == "dask", execution
    assert execution["scheduler"] == address, execution


def test_a_cluster_run_refuses_what_it_cannot_do_in_one_line(tmp_path: Path) -> None:
    campaign = api.from_dict(LOOPBACK)
    with pytest.raises(UserError, match=r"^cluster: the sim backend runs its episodes in "
                                        r"this process for now; drop the cluster"):
        api.run(campaign, tmp_path / "a", cluster="local:1", backend="sim")
    with pytest.raises(UserError, match=r"^tls: tls_ca is not allowed; allowed: "
                                        r"tls_ca_file, tls_cert, tls_key"):
        api.run(campaign, tmp_path / "b", cluster="local:1", tls={"tls_ca": "x"})
    with pytest.raises(UserError, match=r"is not a file; create a lab's certificates"):
        api.run(campaign, tmp_path / "c", cluster="local:1",
                tls={"tls_ca_file": "x", "tls_cert": "y", "tls_key": "z"})
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_the_command_line_names_its_flag(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "c"\nseed = 1\ntemplates = 1\n[grid]\npolicy = ["planfence"]\n'
                    'network = ["loopback"]\nunits = [6]\n')
    proc = subprocess.run([str(BIN / "testbed"), "run", str(path), "--out", "out",
                           "--backend", "sim", "--cluster", "local:1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("testbed run: --cluster: the sim backend runs its episodes"), \
        proc.stderr
    assert "drop --cluster" in lines[-1]
    assert "Traceback" not in proc.stderr
