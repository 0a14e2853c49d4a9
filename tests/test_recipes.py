"""docs/architecture.md's recipes pass the tests: scripts/try-recipes.sh adds a policy
and two shipped networks as the recipes say, on a copy of the checkout, and runs the
tests that cover every network there. A test that spells out the networks it expects
(say, "rate_kbit is allowed only with: fixed") fails on the copy.

The whole suite on the copy is ``bash scripts/try-recipes.sh`` (minutes; not run here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.claims

ROOT = Path(__file__).resolve().parents[1]
NETWORK_TESTS = ("tests/testbed/links/test_profiles.py", "tests/testbed/links/test_netdef.py",
                 "tests/testbed/links/test_traces.py",
                 "tests/testbed/campaign/test_vocabulary.py")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="the recipes are tried on a git checkout")
def test_the_recipes_pass_the_tests_that_cover_every_network() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "try-recipes.sh"), "-v",
                           "-p", "no:randomly", *NETWORK_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "try-recipes: the recipes applied in" in out
    assert "[recipe_lte]" in out  # the new network was picked up from the registry
