"""report.md and report.html: the answer first (the headline table's findings beside the
main figure, unsafe policies and disturbed episodes in one line each), then the tables
with what each one shows and the other figures, then provenance and the disturbance
details (folded in the HTML).

The Markdown links the figure files; the HTML embeds the PNGs (base64) so that one file
can be mailed or opened anywhere.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.load import Run
from testbed.report.naming import UNSAFE_MARK
from testbed.report.tabular import Table, to_html, to_markdown
from testbed.report.unsafe import legend_line

FIGURE_CAPTIONS = {
    "fig2_lowest_stall": "Lowest-stall policy per (network, rho) cell among metadata sync "
    "(K=1), centralized lineage and PlanFence; the text gives the runner-up / winner ratio "
    "of median stall; grey cells are ties under the 10% rule.",
    "fig3_keys": "Median stall and traffic against the number of keys for PlanFence and "
    "batched all-key validation.",
    "figd1_validity": "Share of valid actions against median stall; numbers inside the "
    "metadata-sync markers give the barrier interval K.",
    "fig_budget_frontier": "Budgeted validation: share of issued actions that were invalid "
    "against median stall (left) and traffic (right), one line per ranking through b = 0, "
    "1, ..., all (point labels), with owner-head freshness (square) and PlanFence "
    "(diamond) on the same schedules.",
    "fig_stall_vs_rho": "Median stall against the update rate rho, per policy.",
    "fig_trace_segments": "Capacity of the trace segment each network replayed (the files "
    "the manifest recorded, from each trace offset, for the median episode duration).",
    "fig_command_stall": "Your program's stall per action, as it reported it: the share of "
    "actions (y) that waited at most x ms, per network and policy (command workloads).",
    "fig_link_": "One episode's links from its packet logs: per host, throughput against "
    "the capacity the link offered (grey) and every packet's queueing delay, uplink and "
    "downlink (like mm-throughput-graph and mm-delay-graph).",
    "timeline_": "One episode as a space-time diagram from its history: a lane per host, "
    "writes, derives, checks and acts as marks, recorded calls as arrows, each stale "
    "action ringed in red with a dashed line to the write that superseded its input.",
}


@dataclass(frozen=True)
class ReportInputs:
    run: Run
    tables: list[Table]
    figures: list[Path]  # PNG paths (SVG siblings share the stem)
    notes: list[str]
    draws: int
    seed: int
    link_lines: list[str] = field(default_factory=list)
    paper: Table | None = None  # the paper's cells beside the run (testbed/report/paper.py)
    paper_line: str = ""  # or the one line saying no cell compares
    unsafe: frozenset[str] = frozenset()  # policies with an invalid action (unsafe.py)
    disturbance: str = ""  # the one line on disturbed episodes (attempts.py)


def _caption(stem: str) -> str:
    for prefix, text in FIGURE_CAPTIONS.items():
        if stem.startswith(prefix):
            return text
    return stem


def _provenance_lines(run: Run) -> list[str]:
    lines = [f"Campaign: {run.campaign}"]
    for key in ("backend", "status", "git", "git_revision", "system", "started_at", "ended_at"):
        if key in run.manifest and not isinstance(run.manifest[key], dict | list):
            lines.append(f"{key}: {run.manifest[key]}")
        elif key in run.manifest:
            lines.append(f"{key}: {json.dumps(run.manifest[key], sort_keys=True)}")
    if "backend" not in run.manifest and "backend" in run.episodes:
        backends = ", ".join(sorted(map(str, run.episodes["backend"].unique())))
        lines.append(f"backend: {backends}")
    model = run.manifest.get("model")
    if isinstance(model, dict):  # a live campaign's endpoint (never its key)
        version = (model.get("server_version") or {}).get("version", "unknown")
        lines.append(f"model: {model.get('model')} at {model.get('base_url')} (server "
                     f"{model.get('server') or 'unnamed'}, version {version}, placement "
                     f"{model.get('placement')})")
        identity = model.get("identity")
        if isinstance(identity, dict):  # the served file, by digest
            lines.append(f"model file: {identity.get('file')} ({identity.get('quantization')}, "
                         f"sha256 {identity.get('sha256')}; {identity.get('server')} "
                         f"{identity.get('server_version')}, {identity.get('n_threads')} "
                         "threads)")
        if isinstance(model.get("sampling"), dict):
            lines.append(f"sampling: {json.dumps(model['sampling'], sort_keys=True)}")
        if model.get("stand_in"):
            lines.append("model: THE STAND-IN SERVER (rule-based, not a model): the live "
                         "tables show the harness and the policies, not a model's behaviour")
    return lines


def _overview(run: Run) -> list[str]:
    ep = run.episodes
    aborted = ep[ep["aborted"]]
    lines = [
        f"{len(ep)} episodes ({len(aborted)} aborted), {len(run.actions)} recorded actions, "
        f"{int(ep['scheduled'].sum())} scheduled actions.",
        "Policies: " + ", ".join(sorted(map(str, ep["policy"].unique()))) + ".",
        "Networks: " + ", ".join(sorted(map(str, ep["network"].unique()))) + ".",
    ]
    if not aborted.empty and "abort_reason" in aborted:
        reasons = aborted["abort_reason"].fillna("").astype(str).value_counts()
        lines.append("Abort reasons: " + "; ".join(f"{r or 'unstated'} ({n})"
                                                    for r, n in reasons.items()) + ".")
    return lines


def _conventions(inputs: ReportInputs) -> list[str]:
    return [
        "Costs are medians over workflow templates of each episode's stall (ms per attempted "
        "protected action) and traffic (KiB per action); brackets give interquartile ranges.",
        "Aborted episodes keep their scheduled actions in the availability denominators; "
        "their costs are left out, nothing is imputed.",
        f"Paired intervals: two-stage bootstrap over families then templates, {inputs.draws} "
        f"draws, seed {inputs.seed}, 95% percentile interval of the change in median stall.",
        "A difference under 10% of the larger median is a practical tie. Every paired change "
        "states its resolution (the half-width of its 95% interval) beside that band; one "
        "whose interval straddles an edge of the band is unresolved at this size, neither a "
        "tie nor a difference.",
        "See docs/reports.md in the repository for how to read each table and figure.",
    ]


#: The figure a report opens with: the first of these prefixes that the run drew.
MAIN_FIGURES = ("fig2_lowest_stall", "fig_budget_frontier", "fig_command_stall",
                "fig_stall_vs_rho", "fig3_keys", "figd1_validity")


def main_figure(figures: list[Path]) -> Path | None:
    for prefix in MAIN_FIGURES:
        for png in figures:
            if png.stem.startswith(prefix):
                return png
    return None


def headline(tables: list[Table]) -> Table | None:
    """The table whose findings answer first: the first one that has findings (the
    builders list the paper's headline layouts first)."""
    return next((t for t in tables if t.findings), None)


def _lede(inputs: ReportInputs) -> str:
    ep = inputs.run.episodes
    policies, networks = ep["policy"].nunique(), ep["network"].nunique()
    return (f"{len(ep)} episodes ({int(ep['aborted'].sum())} aborted) of {policies} "
            f"{'policy' if policies == 1 else 'policies'} on {networks} "
            f"{'network' if networks == 1 else 'networks'}.")


def _answer_lines(inputs: ReportInputs) -> tuple[str, list[str], list[str]]:
    """(where the findings come from, the findings, lines under them)."""
    table = headline(inputs.tables)
    source = f"From {table.title}:" if table is not None else ""
    findings = (list(table.findings) if table is not None
                else ["No table layout applies to this campaign; its figures follow."])
    after = [line for line in (legend_line(inputs.unsafe), inputs.disturbance) if line]
    return source, findings, after


def render_markdown(inputs: ReportInputs, out_dir: Path) -> str:
    parts = [f"# Report: {inputs.run.campaign}", "", _lede(inputs), ""]
    source, findings, after = _answer_lines(inputs)
    parts += ["## What this shows", ""] + ([source, ""] if source else [])
    parts += [f"- {finding}" for finding in findings] + [""]
    parts += [*after, ""] if after else []
    main = main_figure(inputs.figures)
    if main is not None:
        parts += _figure_markdown(main, out_dir)
    parts += ["## Tables", ""]
    if not inputs.tables:
        parts.append("This campaign holds none of the cells the table layouts compare.")
    for table in inputs.tables:
        parts.append(to_markdown(table))
        if table.findings:
            parts.append("What this shows:")
            parts += [f"- {finding}" for finding in table.findings]
        files = ", ".join(f"[{ext}](tables/{table.name}.{ext})" for ext in ("csv", "md", "tex"))
        parts += ["", f"Files: {files}", ""]
    parts += _paper_markdown(inputs)
    parts += ["## Figures", ""]
    if not inputs.figures:
        parts.append("No figure applies to this campaign.")
    for png in inputs.figures:
        if png != main:
            parts += _figure_markdown(png, out_dir)
    parts += ["## Conventions", ""] + [f"- {line}" for line in _conventions(inputs)]
    if inputs.link_lines:
        parts += ["", "## Links and host", ""] + [f"- {line}" for line in inputs.link_lines]
    parts += ["", "## Provenance", ""]
    parts += [f"- {line}" for line in _provenance_lines(inputs.run) + _overview(inputs.run)]
    parts.append("")
    if inputs.notes:
        parts += ["## Notes", ""] + [f"- {note}" for note in inputs.notes] + [""]
    config = inputs.run.manifest.get("config")
    if config is not None:
        parts += ["## Campaign configuration", "", "```json",
                  json.dumps(config, indent=2, sort_keys=True, default=str), "```", ""]
    return "\n".join(parts)


def _figure_markdown(png: Path, out_dir: Path) -> list[str]:
    rel = png.relative_to(out_dir).as_posix()
    svg = png.with_suffix(".svg").relative_to(out_dir).as_posix()
    return [f"![{png.stem}]({rel})", "", f"{_caption(png.stem)} ([SVG]({svg}))", ""]


PAPER_HEADING = "The paper beside this run"


def _paper_markdown(inputs: ReportInputs) -> list[str]:
    if inputs.paper is None:
        return [f"## {PAPER_HEADING}", "", inputs.paper_line, ""] if inputs.paper_line else []
    table = inputs.paper
    parts = [f"## {PAPER_HEADING}", "", to_markdown(table)]
    if table.findings:
        parts.append("What this shows:")
        parts += [f"- {finding}" for finding in table.findings]
    files = ", ".join(f"[{ext}](tables/{table.name}.{ext})" for ext in ("csv", "md", "tex"))
    return [*parts, "", f"Files: {files}", ""]


def _paper_html(inputs: ReportInputs) -> list[str]:
    esc = html.escape
    if inputs.paper is None:
        return ([f"<h2>{PAPER_HEADING}</h2>", f"<p>{esc(inputs.paper_line)}</p>"]
                if inputs.paper_line else [])
    body = [f"<h2>{PAPER_HEADING}</h2>", to_html(inputs.paper)]
    if inputs.paper.findings:
        body.append("<p>What this shows:</p><ul>")
        body += [f"<li>{esc(f)}</li>" for f in inputs.paper.findings]
        body.append("</ul>")
    return body


_CSS = """body{font-family:system-ui,sans-serif;max-width:70rem;margin:1rem auto;padding:0 1rem;
line-height:1.4}h1{margin:.2rem 0}table{border-collapse:collapse;margin:1rem 0;display:block;
max-width:100%;overflow-x:auto}td,th{border:1px
solid #ccc;padding:.25rem .5rem;text-align:left}caption{font-weight:600;text-align:left;
padding:.3rem 0}.prov,.legend,.lede,.from{font-size:.85rem;color:#444}img{max-width:100%}
pre{background:#f6f6f6;padding:.5rem;overflow:auto}.answer{display:grid;
grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:1.5rem;align-items:start}
.answer h2{margin-top:0}.answer figure{margin:0}.answer img{max-height:34rem;width:auto}
.unsafe{color:#b00020}details{margin:.5rem 0}summary{cursor:pointer;font-weight:600}
.answer.solo{grid-template-columns:minmax(0,1fr);gap:0}
@media (max-width:60rem){.answer{grid-template-columns:minmax(0,1fr)}}"""


def _figure_html(png: Path, *, main: bool = False) -> str:
    esc = html.escape
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    ident = ' id="main-figure"' if main else ""
    return (f'<figure{ident}><img alt="{esc(png.stem)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(_caption(png.stem))}</figcaption></figure>")


def _details(summary: str, lines: list[str]) -> list[str]:
    esc = html.escape
    return ([f"<details><summary>{esc(summary)}</summary><ul>"]
            + [f"<li>{esc(line)}</li>" for line in lines] + ["</ul></details>"])


def render_html(inputs: ReportInputs) -> str:
    """The answer first (findings beside the main figure), then the tables and the other
    figures, then what a reader opens only when checking (folded)."""
    esc = html.escape
    body = [f"<h1>Report: {esc(inputs.run.campaign)}</h1>",
            f'<p class="lede">{esc(_lede(inputs))}</p>']
    source, findings, after = _answer_lines(inputs)
    main = main_figure(inputs.figures)
    # without a figure the headline table itself is the answer (single-action trials)
    top = headline(inputs.tables) if main is None else None
    body += [f'<section class="answer{" solo" if main is None else ""}"><div id="answer">',
             "<h2>What this shows</h2>"]
    body += [f'<p class="from">{esc(source)}</p>'] if source else []
    body += ["<ul>"] + [f"<li>{esc(f)}</li>" for f in findings] + ["</ul>"]
    body += [f'<p class="{"unsafe" if UNSAFE_MARK in line else "legend"}">{esc(line)}</p>'
             for line in after]
    body.append("</div>")
    if main is not None:
        body.append(_figure_html(main, main=True))
    body += [to_html(top)] if top is not None else []
    body.append("</section>")
    body += ["<h2>Tables</h2>"]
    body += _details("How the numbers are made", _conventions(inputs))
    if not inputs.tables:
        body.append("<p>This campaign holds none of the cells the table layouts compare.</p>")
    for table in inputs.tables:
        if table is top:
            body.append(f"<p>{esc(table.title)}: above, with what it shows.</p>")
            continue
        body.append(to_html(table))
        if table.findings:
            body.append("<p>What this shows:</p><ul>")
            body += [f"<li>{esc(f)}</li>" for f in table.findings]
            body.append("</ul>")
    body += _paper_html(inputs)
    rest = [png for png in inputs.figures if png != main]
    if rest:
        body.append("<h2>Figures</h2>")
        body += [_figure_html(png) for png in rest]
    body.append("<h2>Details</h2>")
    if inputs.link_lines:
        body += _details(f"Disturbance, links and host ({len(inputs.link_lines)} lines)",
                         inputs.link_lines)
    body += _details("Provenance: campaign, revision, system, episodes",
                     _provenance_lines(inputs.run) + _overview(inputs.run))
    if inputs.notes:
        body += _details(f"Notes ({len(inputs.notes)})", inputs.notes)
    config = inputs.run.manifest.get("config")
    if config is not None:
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        body += ["<details><summary>Campaign configuration</summary>",
                 f"<pre>{esc(text)}</pre></details>"]
    title = esc(f"Report: {inputs.run.campaign}")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
