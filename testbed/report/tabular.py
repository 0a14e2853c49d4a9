"""A small table model and its CSV, Markdown, LaTeX and HTML writers.

Each table keeps two views: ``data`` (machine-readable numbers, one row per table row,
written to CSV with provenance columns) and ``rows`` (formatted cells with marks, written
to Markdown, LaTeX and HTML). Marks: ``best`` (bold), ``second`` (underlined),
``lower`` (bold: at least 10% lower than its pair), ``note`` (kept plain, text carries it).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

BEST, SECOND, LOWER = "best", "second", "lower"


@dataclass(frozen=True)
class Cell:
    text: str
    mark: str = ""


@dataclass
class Table:
    name: str  # file stem under tables/
    title: str
    header: list[str]
    rows: list[list[Cell]]
    data: pd.DataFrame
    provenance: str
    legend: str = ""
    findings: list[str] = field(default_factory=list)

    def paths(self, directory: Path) -> dict[str, Path]:
        return {ext: directory / f"{self.name}.{ext}" for ext in ("csv", "md", "tex")}


def fmt(value: float, digits: int = 1) -> str:
    """Fixed-point text, an en dash for a missing value."""
    if pd.isna(value):
        return "–"
    return f"{value:.{digits}f}"


def pct(value: float) -> str:
    return "–" if pd.isna(value) else f"{100 * value:+.1f}%"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _md_cell(cell: Cell) -> str:
    text = _md_escape(cell.text)
    if not text or text == "–":
        return text
    if cell.mark in (BEST, LOWER):
        return f"**{text}**"
    if cell.mark == SECOND:
        return f"<u>{text}</u>"
    return text


def to_markdown(table: Table, *, heading: str = "###") -> str:
    lines = [f"{heading} {table.title}", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in table.header) + " |")
    lines.append("|" + "|".join("---" for _ in table.header) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    lines += ["", f"*{table.provenance}*"]
    if table.legend:
        lines += ["", table.legend]
    return "\n".join(lines) + "\n"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}",
    "–": "--", "×": r"$\times$", "‡": r"$\ddagger$", "ρ": r"$\rho$", "−": "$-$",
    "⚠": r"$^\dagger$",  # naming.UNSAFE_MARK
}


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)


def _tex_cell(cell: Cell) -> str:
    text = tex_escape(cell.text)
    if cell.mark in (BEST, LOWER) and cell.text != "–":
        return rf"\textbf{{{text}}}"
    if cell.mark == SECOND and cell.text != "–":
        return rf"\underline{{{text}}}"
    return text


def to_latex(table: Table) -> str:
    spec = "l" * len(table.header)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in table.header) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(_tex_cell(c) for c in row) + r" \\" for row in table.rows]
    caption = f"{table.title}. {table.provenance} {table.legend}".strip()
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        rf"\caption{{{tex_escape(caption)}}}",
        rf"\label{{tab:{table.name}}}",
        r"\end{table}",
    ]
    return "% requires \\usepackage{booktabs}\n" + "\n".join(lines) + "\n"


def _html_cell(cell: Cell) -> str:
    text = html.escape(cell.text)
    if cell.mark in (BEST, LOWER) and cell.text != "–":
        text = f"<strong>{text}</strong>"
    elif cell.mark == SECOND and cell.text != "–":
        text = f"<u>{text}</u>"
    return f"<td>{text}</td>"


def to_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = "\n".join("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>" for row in table.rows)
    parts = [
        f"<table>\n<caption>{html.escape(table.title)}</caption>",
        f"<thead><tr>{head}</tr></thead>",
        f"<tbody>\n{body}\n</tbody>\n</table>",
        f'<p class="prov">{html.escape(table.provenance)}</p>',
    ]
    if table.legend:
        parts.append(f'<p class="legend">{html.escape(table.legend)}</p>')
    return "\n".join(parts) + "\n"


def write_table(table: Table, directory: Path) -> list[Path]:
    """Write CSV, Markdown and LaTeX files; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = table.paths(directory)
    table.data.to_csv(paths["csv"], index=False)
    paths["md"].write_text(to_markdown(table, heading="#"))
    paths["tex"].write_text(to_latex(table))
    return list(paths.values())
