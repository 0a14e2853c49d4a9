"""A rerun against the run it reproduces: cells, claims, reproduce.md and reproduce.html
(``testbed reproduce``; docs/reproduce.md).

Rules this module obeys:

1. Episodes are paired by episode key and schedule digest: a rerun episode whose
   committed twin has another digest (the workload generator changed) or none is
   counted in the notes and compared with nothing; aborted episodes carry no cost on
   either side (``stats.cost_episodes``).
2. Per cell: the per-template ratios rerun / committed of stall per action and of KiB
   per action, their median and 95% interval (``stats.ratio_median``: the paper's
   statistic, a one-stage bootstrap over templates). The cell's stall **agrees** when
   that interval lies inside the tie band (``stats.interval_verdict`` of ratio - 1 is
   ``tie``), is **lower** or **higher** when it lies wholly beyond it, and is
   unresolved otherwise; traffic is compared template by template (byte-identical or
   not).
3. Claims: ``testbed.report.reproduce_claims`` (the verdict rules), evaluated over the
   committed run, the committed run cut to the rerun's episodes, and the rerun.
4. ``reproduce.md`` and ``reproduce.html`` are written into the rerun's directory;
   nothing of the committed run is written (STYLE rule 10: analysis never rewrites raw
   results).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.report.claims import BRACKET, load_claims
from testbed.report.load import Run, load_run
from testbed.report.reproduce_claims import (
    NOT_REPRODUCED,
    REPRODUCED,
    SKIPPED,
    UNRESOLVED,
    ClaimResult,
    check_claims,
    cut,
)
from testbed.report.stats import RatioSummary, interval_verdict, ratio_median
from testbed.report.tabular import Cell, Table, to_html, to_markdown

VERDICT_ORDER = (NOT_REPRODUCED, UNRESOLVED, REPRODUCED, SKIPPED)
CELL_WORDS = {"tie": "agrees", "lower": "lower", "higher": "higher",
              "unresolved": "unresolved"}


@dataclass(frozen=True)
class CellResult:
    cell: str
    policy: str
    network: str
    pairs: int
    stall_committed: float  # medians over the paired templates
    stall_new: float
    stall: RatioSummary | None
    kib: RatioSummary | None
    same_bytes: int
    verdict: str  # agrees, lower, higher, unresolved


@dataclass(frozen=True)
class Reproduction:
    run: Path
    rerun: Path
    name: str
    reproduces: Mapping[str, Any]
    committed_manifest: Mapping[str, Any]
    rerun_manifest: Mapping[str, Any]
    cells: list[CellResult]
    claims: list[ClaimResult]
    notes: list[str]
    claims_file: Path | None

    def counts(self) -> Counter[str]:
        return Counter(c.verdict for c in self.claims)


def session_minutes(manifest: Mapping[str, Any]) -> float | None:
    """Wall time of a run's sessions (started_at to ended_at), in minutes; None when a
    session recorded no end."""
    total = 0.0
    for session in manifest.get("sessions") or []:
        if "ended_at" not in session or "started_at" not in session:
            return None
        span = pd.Timestamp(session["ended_at"]) - pd.Timestamp(session["started_at"])
        total += span.total_seconds() / 60
    return total


def _pairs(committed: Run, new: Run) -> tuple[pd.DataFrame, list[str]]:
    """Rule 1: rerun and committed costs side by side, and what could not be paired."""
    columns = ["episode", "schedule_digest", "cell", "policy", "network", "family",
               "template", "stall_ms_per_action", "kib_per_action", "aborted"]
    old = committed.episodes[[c for c in columns if c in committed.episodes.columns]]
    now = new.episodes[[c for c in columns if c in new.episodes.columns]]
    both = now.merge(old.assign(twin=True), on="episode", how="left", suffixes=("", "_old"))
    notes = []
    missing = both["twin"].isna()
    if missing.any():
        notes.append(f"{int(missing.sum())} rerun episode(s) have no committed twin (not "
                     "compared)")
    moved = ~missing & (both["schedule_digest"] != both["schedule_digest_old"]) if (
        "schedule_digest_old" in both) else pd.Series(False, index=both.index)
    if moved.any():
        notes.append(f"{int(moved.sum())} rerun episode(s) have another schedule than the "
                     "committed ones (the workload generator changed): not compared")
    aborted = int(both["aborted"].astype(bool).sum())
    if aborted:
        notes.append(f"{aborted} rerun episode(s) aborted (no cost; see the rerun's "
                     "episodes.parquet)")
    kept = both.loc[~missing & ~moved].copy()
    kept = kept.loc[~kept["aborted"].astype(bool) & ~kept["aborted_old"].astype(bool)]
    return kept, notes


def compare_cells(committed: Run, new: Run) -> tuple[list[CellResult], list[str]]:
    """Rule 2, cell by cell in the rerun's order."""
    pairs, notes = _pairs(committed, new)
    out = []
    for cell, group in pairs.groupby("cell", sort=False):
        stall = group.rename(columns={"stall_ms_per_action": "a",
                                      "stall_ms_per_action_old": "b"})
        kib = group.rename(columns={"kib_per_action": "a", "kib_per_action_old": "b"})
        stall_ratio, kib_ratio = ratio_median(stall), ratio_median(kib)
        verdict = "unresolved" if stall_ratio is None or len(group) < 2 else CELL_WORDS[
            interval_verdict(stall_ratio.low - 1, stall_ratio.high - 1)]
        out.append(CellResult(
            str(cell), str(group["policy"].iloc[0]), str(group["network"].iloc[0]),
            len(group), float(group["stall_ms_per_action_old"].median()),
            float(group["stall_ms_per_action"].median()), stall_ratio, kib_ratio,
            int((group["kib_per_action"] == group["kib_per_action_old"]).sum()), verdict))
    return out, notes


def run_name(run: Path, claims_file: Path | None) -> tuple[str, Path]:
    """How a claims file names the run, and the root its ``runs(name)`` reads: the run's
    path below the claims file's folder (``primary``, ``selector/interp``), else the
    run's folder name beside its parent."""
    path = run.resolve()
    if claims_file is not None:
        root = claims_file.resolve().parent
        if path.is_relative_to(root) and path != root:
            return path.relative_to(root).as_posix(), root
    return path.name, path.parent


def compare_rerun(run: Path, rerun: Path, *, claims_file: Path | None) -> Reproduction:
    """Everything ``reproduce.md`` says about ``rerun`` against ``run`` (rules 1-3)."""
    committed, new = load_run(run), load_run(rerun)
    reproduces = new.manifest.get("reproduces") or {}
    keys = set(new.episodes["episode"].astype(str))
    if reproduces.get("cells") and reproduces.get("templates"):
        keys |= {f"{c}/{t}" for c in reproduces["cells"] for t in reproduces["templates"]}
    cells, notes = compare_cells(committed, new)
    filtered = len(reproduces.get("cells") or ()) < int(reproduces.get("of_cells") or 0)
    name, root = run_name(run, claims_file)
    claims: list[ClaimResult] = []
    if claims_file is not None:
        claims = check_claims(
            load_claims(claims_file).claims, run_name=name, root=root, committed=committed,
            at_size=cut(committed, keys), new=new,
            cells=set(reproduces["cells"]) if filtered else None)
    old_git = committed.manifest.get("git") or {}
    new_git = new.manifest.get("git") or {}
    if old_git.get("revision") and old_git.get("revision") != new_git.get("revision"):
        notes.append(f"the rerun ran revision {str(new_git.get('revision'))[:12]}"
                     f"{' (modified)' if new_git.get('dirty') else ''}; the run "
                     f"{str(old_git.get('revision'))[:12]}")
    return Reproduction(run, rerun, name, reproduces, committed.manifest,
                        new.manifest, cells, claims, notes, claims_file)


# --- writing ----------------------------------------------------------------------------


def render_values(text: str, values: Sequence[float]) -> str:
    """A claim's passage with each bracketed number replaced by ``values`` at the
    precision the passage writes."""
    numbers = iter(values)

    def one(match: Any) -> str:
        shown = str(match.group(1))
        value = next(numbers, float("nan"))
        decimals = len(shown.split(".", 1)[1].rstrip("%")) if "." in shown else 0
        body = f"{value:,.{decimals}f}" if "," in shown else f"{value:.{decimals}f}"
        if shown.startswith("+") and value >= 0:
            body = "+" + body
        return body + ("%" if shown.endswith("%") else "")

    return BRACKET.sub(one, text)


def _verdict_text(result: ClaimResult, of_templates: int) -> str:
    if result.verdict != UNRESOLVED:
        return result.verdict
    if result.needed is None:
        return f"{UNRESOLVED} (no estimate)"
    more = f"; the run has {of_templates}" if result.needed > of_templates else ""
    return f"{UNRESOLVED} (about {result.needed} templates{more})"


def _cells_table(rep: Reproduction) -> Table:
    rows = []
    for c in rep.cells:
        stall = "–" if c.stall is None else f"{c.stall.median:.3f} [{c.stall.low:.3f}, " \
                                           f"{c.stall.high:.3f}]"
        kib = "–" if c.kib is None else f"{c.kib.median:.3f} [{c.kib.low:.3f}, {c.kib.high:.3f}]"
        rows.append([Cell(c.cell), Cell(str(c.pairs)), Cell(f"{c.stall_committed:.1f}"),
                     Cell(f"{c.stall_new:.1f}"), Cell(stall), Cell(c.verdict), Cell(kib),
                     Cell(f"{c.same_bytes}/{c.pairs}")])
    return Table("reproduce_cells", "Cells: rerun against committed, paired by episode",
                 ["cell", "templates", "stall committed", "stall rerun",
                  "stall ratio rerun/committed [95%]", "stall", "KiB ratio [95%]",
                  "byte-identical"], rows, pd.DataFrame(),
                 "medians over the paired templates (ms/action); ratios: median of "
                 "per-template ratios with a one-stage bootstrap interval",
                 "stall: agrees when the ratio's interval lies inside the tie band "
                 "(0.90-1.11), lower/higher when wholly beyond it, else unresolved.")


def _claims_table(rep: Reproduction) -> Table:
    of = int(rep.reproduces.get("of_templates") or 0)
    rows = []
    for r in sorted(rep.claims, key=lambda r: VERDICT_ORDER.index(r.verdict)):
        shown = render_values(r.claim.text, r.new) if r.new else r.claim.plain
        rows.append([Cell(_verdict_text(r, of)), Cell(r.claim.plain), Cell(
            shown if r.new else "–"), Cell(r.reason)])
    return Table("reproduce_claims", f"Claims about `{rep.name}`",
                 ["verdict", "the run's text", "as the rerun writes it", "why"], rows,
                 pd.DataFrame(), f"claims file: {rep.claims_file}",
                 "Verdict rules: docs/reproduce.md, \"Verdicts\".")


def _duration(minutes: float) -> str:
    return f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:.1f} min"


def header_lines(rep: Reproduction) -> list[str]:
    r = rep.reproduces
    templates = len(r.get("templates") or ())
    cells = len(r.get("cells") or ())
    old_minutes, new_minutes = (session_minutes(rep.committed_manifest),
                                session_minutes(rep.rerun_manifest))
    lines = [f"reproduces: {r.get('run', rep.run)} (revision "
             f"{str(r.get('revision') or 'unknown')[:12]}, config {r.get('config_digest')})",
             f"size: {templates} of {r.get('of_templates')} templates, {cells} of "
             f"{r.get('of_cells')} cells" + (f" (--cells {r['cell_filter']})"
                                            if r.get("cell_filter") else ""),
             f"rerun: {rep.rerun}" + (f", {_duration(new_minutes)}" if new_minutes is not None
                                      else "")
             + (f" (the run: {_duration(old_minutes)} at its full size)"
                if old_minutes is not None else "")]
    counts = rep.counts()
    lines.append("claims: " + (", ".join(f"{counts[v]} {v}" for v in VERDICT_ORDER
                                         if counts[v]) or "none about this run"))
    agree = Counter(c.verdict for c in rep.cells)
    lines.append("cells (stall): " + ", ".join(f"{n} {v}" for v, n in agree.items()))
    return [*lines, *rep.notes]


def _details(rep: Reproduction) -> list[tuple[str, list[str]]]:
    out = []
    for r in rep.claims:
        if r.verdict == SKIPPED:
            continue
        lines = [f"{c.label}: committed {c.committed}; rerun {c.new}: "
                 f"{c.verdict}" + (f" (about {c.needed} templates)" if c.needed else "")
                 for c in r.checks]
        if r.at_size and len(r.at_size) == len(r.claim.written):
            lines.insert(0, "the committed run at this size writes: "
                         + render_values(r.claim.text, r.at_size))
        out.append((f"{r.verdict}: {r.claim.plain}", lines or [r.reason]))
    return out


def render_markdown(rep: Reproduction) -> str:
    parts = [f"# Reproduction of `{rep.name}`", ""]
    parts += [f"- {line}" for line in header_lines(rep)] + [""]
    parts += [to_markdown(_claims_table(rep), heading="##"), ""]
    parts += [to_markdown(_cells_table(rep), heading="##"), ""]
    parts += ["## Checks behind each verdict", ""]
    for title, lines in _details(rep):
        parts += [f"- {title}"] + [f"  - {line}" for line in lines]
    return "\n".join(parts) + "\n"


_CSS = ("body{font-family:system-ui,sans-serif;max-width:80rem;margin:2rem auto;padding:0 "
        "1rem;line-height:1.4}table{border-collapse:collapse;margin:1rem 0}td,th{border:1px "
        "solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}caption{"
        "font-weight:600;text-align:left}.prov,.legend{font-size:.85rem;color:#444}")


def render_html(rep: Reproduction) -> str:
    esc = html.escape
    body = [f"<h1>Reproduction of {esc(rep.name)}</h1>", "<ul>"]
    body += [f"<li>{esc(line)}</li>" for line in header_lines(rep)] + ["</ul>"]
    body += [to_html(_claims_table(rep)), to_html(_cells_table(rep))]
    body += ["<h2>Checks behind each verdict</h2>", "<ul>"]
    for title, lines in _details(rep):
        body.append(f"<li>{esc(title)}<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines)
                    + "</ul></li>")
    body.append("</ul>")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"Reproduction of {esc(rep.name)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_reproduction(rep: Reproduction) -> tuple[Path, Path]:
    """Rule 4: reproduce.md and reproduce.html in the rerun's directory."""
    md, page = rep.rerun / "reproduce.md", rep.rerun / "reproduce.html"
    md.write_text(render_markdown(rep))
    page.write_text(render_html(rep))
    return md, page


def summary_rows(rep: Reproduction, width: int = 70) -> list[tuple[str, str, str]]:
    """(verdict, claim, why) per claim, worst first, for the terminal."""
    of = int(rep.reproduces.get("of_templates") or 0)
    rows = []
    for r in sorted(rep.claims, key=lambda r: VERDICT_ORDER.index(r.verdict)):
        text = r.claim.plain
        rows.append((_verdict_text(r, of), text if len(text) <= width else
                     text[:width - 1] + "…", r.reason))
    return rows
