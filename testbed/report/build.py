"""``build_report``: read a run directory, write tables/, figures/, report.md, report.html
(into the run directory, or another with ``out``).

Only derived files are written; manifest.json and the Parquet results are read, never
changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from testbed.errors import UserError
from testbed.report import naming
from testbed.report.attempts import disturbed_lines, disturbed_summary
from testbed.report.budget import budget_figure
from testbed.report.delay_figure import delay_figure
from testbed.report.figures import build_figures
from testbed.report.link_figures import link_figures, link_health_lines, resolve_episode
from testbed.report.load import Run, load_run
from testbed.report.paper_beside import paper_section
from testbed.report.render import ReportInputs, render_html, render_markdown
from testbed.report.stats import DEFAULT_DRAWS
from testbed.report.tables import build_tables
from testbed.report.tables_command import COMMAND_KIND, command_figures
from testbed.report.tables_trials import trial_kind
from testbed.report.tabular import write_table
from testbed.report.timeline import episode_folder, timeline_figure
from testbed.report.unsafe import explain_in_tables, unsafe_policies


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
    out: Path | None = None,
    timeline: bool = False,
) -> dict[str, Any]:
    """Write the report of the campaign in ``run_dir``; returns what was written.

    Keys of the result: ``campaign``, ``tables`` (names), ``table_files``, ``figures``
    (PNG and SVG paths), ``figure_data`` (CSV behind figures), ``report_md``,
    ``report_html``, ``notes`` (parts skipped and why), ``paper`` (the name of the
    paper-beside table under tables/, None when no cell compares). ``episode``: the
    episode whose link plots to draw (default: the first with a link log of each network).
    ``exclude_disturbed``: leave disturbed attempts out of every table and figure.
    ``out``: where to write (default ``run_dir``; the run directory is then only read).
    ``timeline``: also draw ``episode``'s space-time diagram from its history (first in
    the figures; its link plots only when it has a packet log).
    Policies with an invalid action are marked unsafe in every table and figure.
    """
    if draws < 1:
        raise UserError(f"--draws: {draws} is not allowed; allowed: an integer >= 1")
    run_dir = Path(run_dir)
    out_dir = Path(out) if out is not None else run_dir

    def say(message: str) -> None:
        if console is not None:
            console.print(message)

    run = load_run(run_dir, exclude_disturbed=exclude_disturbed)
    timeline_key: str | None = None
    if timeline:  # before minutes of bootstrap, not after
        if episode is None:
            raise UserError("--timeline: needs --episode KEY")
        timeline_key, _ = episode_folder(run_dir, episode)
        episode = timeline_key if _has_link_log(run, timeline_key) else None
    elif episode is not None:
        episode = resolve_episode(run, episode)
    say(f"report: {run.campaign}: {len(run.episodes)} episodes, {len(run.actions)} actions")
    host_lines = ([] if run.attempts is None
                  else disturbed_lines(run.attempts, run.excluded))
    disturbance = ("" if run.attempts is None
                   else disturbed_summary(run.attempts, run.excluded))
    if run.excluded is not None:
        say(f"report: --exclude-disturbed left out {run.excluded[0]} attempts "
            f"({run.excluded[1]} episodes with no undisturbed attempt)")
    unsafe = unsafe_policies(run)
    with naming.marking_unsafe(unsafe):
        tables = build_tables(run, draws=draws, seed=seed)
        paper, paper_line = paper_section(run)
        explain_in_tables([*tables, *([paper] if paper is not None else [])], unsafe)
        table_files: list[Path] = []
        for table in tables:
            table_files += write_table(table, out_dir / "tables")
        say(f"report: {len(tables)} tables -> {out_dir / 'tables'}")
        if paper is not None:
            table_files += write_table(paper, out_dir / "tables")
        say(f"report: the paper beside this run: {len(paper.rows)} cells"
            if paper is not None else f"report: {paper_line}")
        written, notes = _figures(run, out_dir / "figures", episode)
        if timeline_key is not None:
            written = timeline_figure(run_dir, timeline_key, out_dir / "figures") + written
    figure_paths = [p for p in written if p.suffix in (".png", ".svg")]
    figure_data = [p for p in written if p not in figure_paths]
    say(f"report: {len(figure_paths)} figure files -> {out_dir / 'figures'}")
    pngs = [p for p in figure_paths if p.suffix == ".png"]
    inputs = ReportInputs(run, tables, pngs, notes, draws, seed,
                          link_health_lines(run) + host_lines, paper, paper_line,
                          unsafe=unsafe, disturbance=disturbance)
    report_md = out_dir / "report.md"
    report_html = out_dir / "report.html"
    report_md.write_text(render_markdown(inputs, out_dir))
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


def _has_link_log(run: Run, key: str) -> bool:
    ep = run.episodes
    return "link_log" in ep and bool(ep[ep["episode"] == key]["link_log"].notna().any())


def _figures(run: Run, directory: Path, episode: str | None) -> tuple[list[Path], list[str]]:
    """Every figure the run's kind draws; (paths, notes on what was skipped)."""
    kind = trial_kind(run)
    if kind not in ("episodes", COMMAND_KIND):  # single-action trials: the table is it
        return [], [f"{kind} trials: no figures (the table is the result)"]
    if kind == "episodes":
        written, notes = build_figures(run, directory)
        written += budget_figure(run, directory)
    else:
        written, notes = command_figures(run, directory)
    link_paths, link_notes = link_figures(run, directory, episode=episode)
    delay_paths, delay_notes = delay_figure(run, directory)
    return written + link_paths + delay_paths, notes + link_notes + delay_notes
