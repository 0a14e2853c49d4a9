"""``build_report``: read a run directory, write tables/, figures/, report.md, report.html.

Only derived files are written; manifest.json and the Parquet results are read, never
changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from testbed.errors import UserError
from testbed.report.attempts import disturbed_lines
from testbed.report.budget import budget_figure
from testbed.report.delay_figure import delay_figure
from testbed.report.figures import build_figures
from testbed.report.link_figures import link_figures, link_health_lines, resolve_episode
from testbed.report.load import load_run
from testbed.report.paper_beside import paper_section
from testbed.report.render import ReportInputs, render_html, render_markdown
from testbed.report.stats import DEFAULT_DRAWS
from testbed.report.tables import build_tables
from testbed.report.tables_command import COMMAND_KIND, command_figures
from testbed.report.tables_trials import trial_kind
from testbed.report.tabular import write_table


class Printer(Protocol):
    """Anything with a rich-Console-like ``print`` (rich.console.Console fits)."""

    def print(self, *objects: Any) -> None: ...


def build_report(
    run_dir: Path,
    *,
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
    console: Printer | None = None,
    episode: str | None = None,
    exclude_disturbed: bool = False,
) -> dict[str, Any]:
    """Write the report of the campaign in ``run_dir``; returns what was written.

    Keys of the result: ``campaign``, ``tables`` (names), ``table_files``, ``figures``
    (PNG and SVG paths), ``figure_data`` (CSV behind figures), ``report_md``,
    ``report_html``, ``notes`` (parts skipped and why), ``paper`` (the name of the
    paper-beside table under tables/, None when no cell compares). ``episode``: the
    episode whose link plots to draw (default: the first with a link log of each network).
    ``exclude_disturbed``: leave disturbed attempts out of every table and figure.
    """
    if draws < 1:
        raise UserError(f"--draws: {draws} is not allowed; allowed: an integer >= 1")
    run_dir = Path(run_dir)

    def say(message: str) -> None:
        if console is not None:
            console.print(message)

    run = load_run(run_dir, exclude_disturbed=exclude_disturbed)
    if episode is not None:  # before minutes of bootstrap, not after
        episode = resolve_episode(run, episode)
    say(f"report: {run.campaign}: {len(run.episodes)} episodes, {len(run.actions)} actions")
    host_lines = ([] if run.attempts is None
                  else disturbed_lines(run.attempts, run.excluded))
    if run.excluded is not None:
        say(f"report: --exclude-disturbed left out {run.excluded[0]} attempts "
            f"({run.excluded[1]} episodes with no undisturbed attempt)")
    tables = build_tables(run, draws=draws, seed=seed)
    table_files: list[Path] = []
    for table in tables:
        table_files += write_table(table, run_dir / "tables")
    say(f"report: {len(tables)} tables -> {run_dir / 'tables'}")
    paper, paper_line = paper_section(run)
    if paper is not None:
        table_files += write_table(paper, run_dir / "tables")
    say(f"report: the paper beside this run: {len(paper.rows)} cells" if paper is not None
        else f"report: {paper_line}")
    kind = trial_kind(run)
    if kind in ("episodes", COMMAND_KIND):
        if kind == "episodes":
            written, notes = build_figures(run, run_dir / "figures")
            written += budget_figure(run, run_dir / "figures")
        else:
            written, notes = command_figures(run, run_dir / "figures")
        link_paths, link_notes = link_figures(run, run_dir / "figures", episode=episode)
        delay_paths, delay_notes = delay_figure(run, run_dir / "figures")
        written = written + link_paths + delay_paths
        notes = notes + link_notes + delay_notes
    else:  # single-action trials: their table is the result
        written, notes = [], [f"{trial_kind(run)} trials: no figures (the table is the result)"]
    figure_paths = [p for p in written if p.suffix in (".png", ".svg")]
    figure_data = [p for p in written if p not in figure_paths]
    say(f"report: {len(figure_paths)} figure files -> {run_dir / 'figures'}")
    pngs = [p for p in figure_paths if p.suffix == ".png"]
    inputs = ReportInputs(run, tables, pngs, notes, draws, seed,
                          link_health_lines(run) + host_lines, paper, paper_line)
    report_md = run_dir / "report.md"
    report_html = run_dir / "report.html"
    report_md.write_text(render_markdown(inputs, run_dir))
    report_html.write_text(render_html(inputs))
    for note in notes:
        say(f"report: note: {note}")
    say(f"report: {report_md}")
    return {
        "campaign": run.campaign,
        "tables": [t.name for t in tables],
        "table_files": table_files,
        "figures": figure_paths,
        "figure_data": figure_data,
        "report_md": report_md,
        "report_html": report_html,
        "notes": notes,
        "paper": paper.name if paper is not None else None,
    }
