"""The report answers first: findings and the main figure on the first screen, unsafe
policies marked wherever they appear, disturbance in one line, details folded at the end.

The layout is checked in a real headless browser (Debian's ``chromium``; skipped where
it is not installed: ``apt-get install chromium``, which scripts/test.sh's setup lane
does as root) on a committed reference run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.image
import pytest

from testbed.report.build import build_report
from testbed.report.naming import UNSAFE_MARK
from testbed.report.unsafe import LEGEND
from tests.testbed.report.report_fixtures import make_campaign

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
WIDTH, HEIGHT = 1280, 800


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = make_campaign("unsafe", [{"policy": ["owner_head_freshness", "metadata_sync",
                                                "centralized_lineage", "planfence"],
                                     "rho": [1.0, 4.0]}], seed=5)
    path = data.write(tmp_path_factory.mktemp("unsafe") / "run")
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays searchable
        return build_report(path, draws=50)


def test_unsafe_policy_is_marked_in_tables_with_a_legend(synthetic: dict[str, Any]) -> None:
    table = (synthetic["report_md"].parent / "tables" / "table_d1_att.md").read_text()
    assert f"Owner-head freshness {UNSAFE_MARK}" in table
    assert f"PlanFence {UNSAFE_MARK}" not in table  # safe: no invalid action
    assert LEGEND in table
    tex = (synthetic["report_md"].parent / "tables" / "table_d1_att.tex").read_text()
    assert UNSAFE_MARK not in tex
    assert r"$^\dagger$" in tex


def test_unsafe_policy_is_marked_in_figures(synthetic: dict[str, Any]) -> None:
    svg = (synthetic["report_md"].parent / "figures" / "fig_stall_vs_rho.svg").read_text()
    assert f"Owner-head freshness {UNSAFE_MARK}" in svg
    assert LEGEND in svg
    assert "stroke-dasharray" in svg  # the unsafe line is dashed, the others solid
    trace = (synthetic["report_md"].parent / "figures" / "fig_trace_segments.svg").read_text()
    assert LEGEND not in trace  # names no policy: no legend line


def test_html_puts_the_answer_first_and_folds_the_details(synthetic: dict[str, Any]) -> None:
    html = synthetic["report_html"].read_text()
    answer, figure = html.index('<div id="answer">'), html.index('<figure id="main-figure">')
    tables = html.index("<h2>Tables</h2>")
    assert answer < figure < tables
    assert "Lowest safe stall" in html[answer:figure]
    assert LEGEND in html[answer:figure]
    assert "Disturbance: " in html[answer:figure]
    assert html.index("<summary>Provenance") > tables
    assert "<summary>Disturbance, links and host" in html
    assert '<img alt="fig2_lowest_stall"' in html[figure:tables]  # the main figure
    assert html.count('<img alt="fig2_lowest_stall"') == 1


def test_markdown_puts_the_answer_first(synthetic: dict[str, Any]) -> None:
    md = synthetic["report_md"].read_text()
    assert md.index("## What this shows") < md.index("](figures/fig2_lowest_stall.png)") \
        < md.index("## Tables") < md.index("## Provenance")


def test_out_writes_elsewhere_and_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    run = make_campaign("elsewhere", [{"policy": ["planfence", "metadata_sync"]}]).write(
        tmp_path / "run")
    before = sorted(p.name for p in run.iterdir())
    summary = build_report(run, draws=20, out=tmp_path / "out")
    assert sorted(p.name for p in run.iterdir()) == before
    assert summary["report_html"] == tmp_path / "out" / "report.html"
    assert (tmp_path / "out" / "tables").is_dir()
    assert "](figures/" in summary["report_md"].read_text()  # links relative to out


def _probe_page(html: Path) -> Path:
    """A copy of the report that writes where the answer and main figure lie once loaded."""
    script = """<script>
window.addEventListener('load', () => {
  const box = e => { const b = e.getBoundingClientRect();
    return {top: b.top + scrollY, bottom: b.bottom + scrollY, left: b.left,
            right: b.right, height: b.height}; };
  const probe = {viewport: innerWidth, scroll_width: document.documentElement.scrollWidth,
    bullets: [...document.querySelectorAll('#answer li')].map(box),
    figure: box(document.querySelector('#main-figure img')),
    tables: box(document.querySelector('h2 ~ table'))};
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(probe); document.body.appendChild(pre);
});
</script>"""
    page = html.with_name("probe.html")
    page.write_text(html.read_text().replace("</body>", script + "</body>"))
    return page


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    chromium = shutil.which("chromium")
    assert chromium is not None
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *args],
        capture_output=True, text=True, timeout=180, check=True)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium (apt-get install chromium) for the browser check")
def test_first_screen_of_a_reference_run_shows_the_answer(tmp_path: Path) -> None:
    summary = build_report(ROOT / "results" / "budget", draws=200, out=tmp_path / "report")
    page = _probe_page(summary["report_html"])
    dom = _chromium("--run-all-compositor-stages-before-draw", "--virtual-time-budget=10000",
                    "--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    probe = json.loads(dom[start:dom.index("</pre>", start)].replace("&quot;", '"'))
    # --dump-dom lays the page out in a 657 px tall viewport (the window less a browser's
    # chrome), the screenshot in 800: the layout depends on the width only
    assert probe["viewport"] == WIDTH
    assert probe["bullets"], "no answer bullets"
    assert all(b["bottom"] <= HEIGHT for b in probe["bullets"]), probe["bullets"]
    figure = probe["figure"]
    assert figure["height"] > 300, figure  # drawn at a readable size, not a thumbnail
    assert figure["bottom"] <= HEIGHT, figure
    assert probe["tables"]["top"] > figure["bottom"]  # the tables come after the answer
    assert probe["scroll_width"] <= WIDTH  # nothing pushes the page sideways

    shot = tmp_path / "first_screen.png"
    _chromium(f"--screenshot={shot}", summary["report_html"].as_uri(),
              profile=tmp_path / "profile")
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    region = pixels[int(figure["top"]):int(figure["bottom"]),
                    int(figure["left"]):int(figure["right"]), :3]
    assert (region.mean(axis=2) < 0.5).mean() > 0.01  # the figure's ink is on screen
    first = probe["bullets"][0]
    text = pixels[int(first["top"]):int(first["bottom"]), int(first["left"]):
                  int(first["right"]), :3]
    assert (text.mean(axis=2) < 0.5).mean() > 0.01  # so is the first finding's text
