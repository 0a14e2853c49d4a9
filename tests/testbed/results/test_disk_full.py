"""A full results disk ends `testbed run` with one line naming the file, and `--resume`
continues (testbed.results.atomic, testbed.run.loop rule 10).

The results go to a small tmpfs mounted in a private mount namespace (`unshare -m`, as
root), which the namespace takes with it when the script ends: nothing is mounted on
the host. Loopback episodes, so no network is built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

CAMPAIGN = """name = "full"
seed = 1
templates = 10
[grid]
policy = ["planfence", "batched_all_key"]
network = ["loopback"]
agents = [2]
keys = [2]
units = [8]
"""

SCRIPT = """set -u
mount -t tmpfs -o size=400k tmpfs "$DISK"
"$PY" -m testbed run c.toml --out "$DISK/out" 2> first.err
echo $? > first.code
ls "$DISK/out/shards/episodes" | wc -l > first.count
mount -o remount,size=16m "$DISK"
"$PY" -m testbed run c.toml --out "$DISK/out" --resume > second.out 2> second.err
echo $? > second.code
ls "$DISK/out/shards/episodes" | wc -l > second.count
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private tmpfs")


def test_a_full_disk_is_one_line_naming_the_file_and_resume_finishes(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(CAMPAIGN)
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "DISK": str(disk), "PY": sys.executable}
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT],
                   cwd=tmp_path, env=env, check=True, timeout=600)
    first_err = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.code").read_text().strip() == "3", first_err
    assert "Traceback" not in first_err
    lines = [x for x in first_err.splitlines() if not x.startswith("progress:")]
    assert len(lines) == 1, first_err
    assert lines[0].startswith(f"testbed run: results disk full: no space left writing "
                               f"{disk}/out/")
    assert lines[0].endswith("then run the same command with --resume (nothing written so "
                             "far is lost)")
    kept = int((tmp_path / "first.count").read_text())
    assert 0 < kept < 20, "the disk filled before the last episode and after the first"
    second_err = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.code").read_text().strip() == "0", second_err[-3000:]
    assert int((tmp_path / "second.count").read_text()) == 20
    assert not any(disk.iterdir()), "the tmpfs was mounted on the host"
