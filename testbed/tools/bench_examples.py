"""``testbed bench examples``: each bundled example run as a user runs it, its wall time
against ``testbed check``'s estimate.

Per example (``testbed examples list``): copy it into a scratch folder, install its
plugin package there if it has one (``pip install --no-deps --target``, on
``PYTHONPATH``, as its README says), read the estimate ``testbed check`` prints, and
time ``testbed run campaign.toml --out run`` as a fresh process (start, probes,
topologies, episodes, consolidation: everything a user waits for). The result per
example: estimate, measured wall time, their ratio, episode count and the host's load
average before and after (the estimate assumes a host running nothing else).
The runs keep their host lanes (``testbed.host.lanes``) in the scratch folder: with the
host's own lane state they would queue behind every other run on a shared host (one
waiting for a loopback cell stops all others) and the bench would time that queue, not
the example. Needs root for the examples' shaped links.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from testbed.host.lanes import DIR_ENV
from testbed.tools.examples import copy_example, example_names

ESTIMATE = re.compile(r"estimated wall time: about ([\d.]+) (s|min|h)")
UNIT_S = {"s": 1.0, "min": 60.0, "h": 3600.0}


def _estimate_s(text: str) -> float:
    match = ESTIMATE.search(text)
    if match is None:
        raise RuntimeError(f"testbed check printed no estimate:\n{text}")
    return float(match.group(1)) * UNIT_S[match.group(2)]


def _testbed(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=3600, check=False)


def bench_example(name: str, scratch: Path) -> dict[str, Any]:
    folder = scratch / name
    copy_example(name, folder)
    env = {**os.environ, DIR_ENV: str(scratch / "host-lanes")}  # module docstring
    if (folder / "pyproject.toml").is_file():  # a plugin package: installed, as its README
        site = scratch / f"{name}-site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--target", str(site), str(folder)], check=True, timeout=600)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site),
                                                           env.get("PYTHONPATH", "")]))
    checked = _testbed(["check", "campaign.toml"], folder, env)
    if checked.returncode != 0:
        raise RuntimeError(f"{name}: testbed check failed: {checked.stderr}")
    estimate = _estimate_s(checked.stdout)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    ran = _testbed(["run", "campaign.toml", "--out", "run"], folder, env)
    wall = time.monotonic() - started
    if ran.returncode != 0:
        raise RuntimeError(f"{name}: testbed run failed: {ran.stderr[-2000:]}")
    episodes = len(list((folder / "run" / "shards" / "episodes").glob("*.parquet")))
    return {"example": name, "estimate_s": round(estimate, 1), "measured_s": round(wall, 1),
            "ratio": round(wall / estimate, 2), "episodes": episodes,
            "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1)}


def bench_examples(json_path: Path | None, console: Console,
                   names: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tb-bench-examples-") as tmp:
        for name in names or example_names():
            console.print(f"examples: running {name}", markup=False)
            rows.append(bench_example(name, Path(tmp)))
    table = Table(title="bundled examples: measured wall time against the estimate")
    for column in ("example", "estimate s", "measured s", "measured / estimate", "episodes",
                   "load before / after"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["example"], f"{r['estimate_s']:g}", f"{r['measured_s']:g}",
                      f"{r['ratio']:g}", str(r["episodes"]),
                      f"{r['load_before']:g} / {r['load_after']:g}")
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(rows, indent=2) + "\n")
    return rows
