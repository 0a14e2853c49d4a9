"""A report labels a plugin policy with its registered title when the run's plugin still
imports (testbed.campaign.plugins rule 3), and keeps its name with a note when not."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from protocols.policies.registry import policy_class, unregister
from testbed import api
from tests.testbed.report.report_fixtures import make_campaign

pytestmark = pytest.mark.slow

PLUGIN = """
from protocols.api import Policy, register

@register
class Titled(Policy):
    name = "test_titled"
    display_name = "A titled plugin"
"""


def _run(tmp_path: Path, plugins: dict[str, object]) -> Path:
    run = make_campaign("plugin-report", [{"policy": ["planfence", "test_titled"]}])
    path = run.write(tmp_path / "run")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["plugins"] = plugins
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_the_recorded_plugin_labels_its_policy(tmp_path: Path) -> None:
    plugin = tmp_path / "titled.py"
    plugin.write_text(PLUGIN)
    path = _run(tmp_path, {str(plugin): {"module": "x", "policies": ["test_titled"]}})
    try:
        api.report(path, draws=20, console=Console(file=io.StringIO()))
        assert policy_class("test_titled") is not None
    finally:
        unregister("test_titled")
    table = (path / "tables" / "table_d1_att.md").read_text()
    assert "| A titled plugin |" in table


def test_a_plugin_that_no_longer_imports_keeps_its_name(tmp_path: Path) -> None:
    path = _run(tmp_path, {"gone:thing": {"module": "no_such_plugin_module_here"}})
    out = io.StringIO()
    api.report(path, draws=20, console=Console(file=out, width=300))
    assert "plugin 'gone:thing' of the run was not loaded" in out.getvalue()
    assert "| test_titled |" in (path / "tables" / "table_d1_att.md").read_text()
