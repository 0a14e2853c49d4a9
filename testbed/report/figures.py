"""Figures (PNG and SVG) in the layouts of the paper's figures 2, 3 and D.1, plus stall
against rho and the capacity-trace segments each network profile replayed.

Figures are drawn on ``matplotlib.figure.Figure`` objects (Agg canvas, no pyplot state),
so building a report never opens a window or touches a global backend. Every function
returns the paths it wrote, or an empty list when the campaign lacks the cells.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from testbed.report import naming, slicing
from testbed.report.load import Run
from testbed.report.stats import TIE_FRACTION, practical_tie, summarise
from testbed.report.unsafe import explain_in_figure
from testbed.results.schema import STRATUM_COLUMNS as CELL_COLUMNS

COLORS = {
    "metadata_sync": "#1f77b4",
    "centralized_lineage": "#ff7f0e",
    "planfence": "#2ca02c",
    "batched_all_key": "#d62728",
    "local_replica": "#7f7f7f",
    "owner_head_freshness": "#8c564b",
    "per_key_all_key": "#e377c2",
    "all_replica": "#9467bd",
    "majority_replica": "#17becf",
    "planfence_grouped": "#bcbd22",
    "adaptive": "#000000",
}
TIE_GREY = "#bdbdbd"
UNSAFE_EDGE = "#b00020"  # the edge of an unsafe metadata-sync marker in figure D.1
SHORT = {"metadata_sync": "MS", "centralized_lineage": "CL", "planfence": "PF"}


def save(figure: Figure, directory: Path, stem: str) -> list[Path]:
    """Write ``stem``.png and ``stem``.svg (no timestamps, so reruns are byte-stable); a
    figure that labels an unsafe policy gets the line that explains the mark."""
    explain_in_figure(figure)
    directory.mkdir(parents=True, exist_ok=True)
    png, svg = directory / f"{stem}.png", directory / f"{stem}.svg"
    figure.savefig(png, dpi=150, metadata={"Software": None})
    # SVG element ids are hashes salted with a random value unless a salt is set
    with matplotlib.rc_context({"svg.hashsalt": stem}):
        figure.savefig(svg, metadata={"Date": None})
    return [png, svg]


def _median_stall(frame: pd.DataFrame) -> float:
    return summarise(frame, list(CELL_COLUMNS)).stall_ms


def lowest_stall_cells(run: Run) -> pd.DataFrame:
    """Per (connection, network, rho): winner and runner-up among the three primary
    policies by median stall, their ratio, the tie flag and unavailable actions."""
    columns = ["connection", "network", "rho", "winner", "runner_up", "winner_stall_ms",
               "runner_up_stall_ms", "ratio", "tie", "unavailable_actions"]
    frame = run.episodes[run.episodes["policy"].isin(naming.PRIMARY_THREE)]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame = slicing.slice_for(frame, free=("network", "rho", "connection")).episodes
    records = []
    for (connection, net, rho), part in frame.groupby(["connection", "network", "rho"]):
        medians = sorted((_median_stall(part[part["policy"] == p]), p)
                         for p in naming.PRIMARY_THREE if (part["policy"] == p).any())
        medians = [(m, p) for m, p in medians if not math.isnan(m)]
        if len(medians) < 2:
            continue
        (best, winner), (second, runner_up) = medians[0], medians[1]
        records.append({
            "connection": connection, "network": net, "rho": rho, "winner": winner,
            "runner_up": runner_up, "winner_stall_ms": best, "runner_up_stall_ms": second,
            "ratio": second / best if best > 0 else math.inf,
            "tie": practical_tie(best, second),
            "unavailable_actions": int((part["scheduled"] - part["available"]).sum()),
        })
    return pd.DataFrame(records, columns=columns)


def winners_figure(run: Run, directory: Path) -> list[Path]:
    """Figure 2: lowest-stall policy per (network, rho) among the three primary policies;
    the numbers behind it go to fig2_lowest_stall.csv."""
    cells = lowest_stall_cells(run)
    if cells.empty:
        return []
    connections = [str(c) for c in slicing.sorted_values(cells, "connection")]
    nets = slicing.networks(cells)
    rhos = slicing.sorted_values(cells, "rho")
    grids: dict[str, list[list[tuple[str, float, int] | None]]] = {}
    for connection in connections:
        grid: list[list[tuple[str, float, int] | None]] = []
        for rho in rhos:
            row: list[tuple[str, float, int] | None] = []
            for net in nets:
                hit = cells[(cells["connection"] == connection) & (cells["network"] == net)
                            & (cells["rho"] == rho)]
                if hit.empty:
                    row.append(None)
                    continue
                found = hit.iloc[0]
                label = "tie" if bool(found["tie"]) else str(found["winner"])
                row.append((label, float(found["ratio"]), int(found["unavailable_actions"])))
            grid.append(row)
        grids[connection] = grid
    directory.mkdir(parents=True, exist_ok=True)
    table_path = directory / "fig2_lowest_stall.csv"
    cells.to_csv(table_path, index=False)
    figure = Figure(figsize=(max(6.0, 1.6 * len(nets) * len(grids) + 1.5),
                             0.7 * len(rhos) + 2.0),
                    layout="constrained")
    axes = figure.subplots(1, len(grids), squeeze=False)[0]
    for ax, (connection, grid) in zip(axes, grids.items(), strict=True):
        for i, row in enumerate(grid):
            for j, cell in enumerate(row):
                if cell is None:
                    color, text = "white", "–"
                else:
                    label, ratio, short = cell
                    color = TIE_GREY if label == "tie" else COLORS[label]
                    text = ("tie " if label == "tie" else f"{SHORT[label]} ") + (
                        f"{ratio:.2f}×" if math.isfinite(ratio) else "∞") + ("†" if short else "")
                ax.fill_between([j, j + 1], i, i + 1, color=color, linewidth=0)
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8)
        ax.set_xlim(0, len(nets))
        ax.set_ylim(0, len(rhos))
        ax.set_xticks([j + 0.5 for j in range(len(nets))], nets)
        ax.set_yticks([i + 0.5 for i in range(len(rhos))], [slicing.number(r) for r in rhos])
        ax.set_ylabel("rho (updates per protected action)")
        ax.set_title(f"connection: {connection}")
    handles = [Patch(color=COLORS[p], label=naming.display_name(p)) for p in naming.PRIMARY_THREE]
    handles.append(Patch(color=TIE_GREY, label=f"tie (< {TIE_FRACTION:.0%})"))
    figure.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8)
    figure.suptitle("Lowest median stall per cell (text: runner-up / winner)\n"
                    "†: some scheduled action of the cell was not available", fontsize=10)
    return [*save(figure, directory, "fig2_lowest_stall"), table_path]


def keys_figure(run: Run, directory: Path) -> list[Path]:
    """Figure 3: stall and traffic against keys for PlanFence and batched all-key."""
    pair = ("planfence", "batched_all_key")
    frame = run.episodes[run.episodes["policy"].isin(pair)]
    if frame.empty or frame["keys"].nunique() < 2:
        return []
    frame = slicing.slice_for(frame, free=("keys", "network", "trace_offset_s")).episodes
    figure = Figure(figsize=(9, 3.6), layout="constrained")
    stall_ax, kib_ax = figure.subplots(1, 2)
    drawn = False
    for net, style in zip(slicing.networks(frame), ("-o", "--s", ":^", "-.v", "-D", "--x"),
                          strict=False):
        for policy in pair:
            part = frame[(frame["network"] == net) & (frame["policy"] == policy)]
            keys = slicing.sorted_values(part, "keys")
            if len(keys) < 2:
                continue
            stats = [summarise(part[part["keys"] == k], list(CELL_COLUMNS)) for k in keys]
            x = [float(str(k)) for k in keys]
            label = f"{naming.display_name(policy)}, {net}"
            stall_ax.plot(x, [s.stall_ms for s in stats], style, color=COLORS[policy], label=label)
            kib_ax.plot(x, [s.kib for s in stats], style, color=COLORS[policy], label=label)
            drawn = True
    if not drawn:
        return []
    for ax, ylabel in ((stall_ax, "median stall (ms/action)"),
                       (kib_ax, "median traffic (KiB/action)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("keys |X|")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    kib_ax.legend(fontsize=7)
    figure.suptitle("Scoped (PlanFence) against batched all-key validation")
    return save(figure, directory, "fig3_keys")


def validity_figure(run: Run, directory: Path) -> list[Path]:
    """Figure D.1: share of valid actions against stall, metadata-sync markers labelled K."""
    paths: list[Path] = []
    for net in slicing.networks(run.episodes):
        frame = slicing.slice_for(run.episodes, free=("rho",), where={"network": net}).episodes
        ks = {naming.sync_interval(p) for p in frame["policy"].unique()} - {None}
        if len(ks) < 2:
            continue
        rhos = slicing.sorted_values(frame, "rho")
        unsafe_k = False
        figure = Figure(figsize=(3.0 * len(rhos) + 2.5, 3.4), layout="constrained")
        axes = figure.subplots(1, len(rhos), squeeze=False, sharey=True)[0]
        for ax, rho in zip(axes, rhos, strict=True):
            part = frame[frame["rho"] == rho]
            for policy in naming.ordered(part["policy"].unique()):
                s = summarise(part[part["policy"] == policy], list(CELL_COLUMNS))
                if s.scheduled == 0 or math.isnan(s.stall_ms):
                    continue
                y = s.valid / s.scheduled
                k = naming.sync_interval(policy)
                if k is not None:
                    unsafe = naming.is_marked_unsafe(policy)
                    unsafe_k = unsafe_k or unsafe
                    ax.scatter([s.stall_ms], [y], s=170, color=COLORS["metadata_sync"], alpha=0.7,
                               edgecolors=UNSAFE_EDGE if unsafe else "none", linewidths=1.5)
                    ax.annotate(str(k), (s.stall_ms, y), ha="center", va="center", fontsize=7,
                                color="white")
                else:
                    ax.scatter([s.stall_ms], [y], s=60, marker="D",
                               color=COLORS.get(policy, "#555555"),
                               label=naming.display_name(policy))
            ax.set_title(f"rho = {slicing.number(rho)}")
            ax.set_xlabel("median stall (ms/action)")
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("valid / scheduled")
        axes[0].set_ylim(-0.05, 1.05)
        by_label: dict[str, Any] = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                by_label.setdefault(label, handle)
        handles = list(by_label.values())
        handles.append(Patch(color=COLORS["metadata_sync"], label="Metadata sync (number = K)"))
        if unsafe_k:
            handles.append(Patch(facecolor=COLORS["metadata_sync"], edgecolor=UNSAFE_EDGE,
                                 label=f"red edge: {naming.UNSAFE_MARK}"))
        figure.legend(handles=handles, fontsize=7, loc="outside right center")
        figure.suptitle(f"Validity against stall on {net}")
        paths += save(figure, directory, f"figd1_validity_{net}")
    return paths


def rho_figure(run: Run, directory: Path) -> list[Path]:
    """Median stall against rho, one line per policy, one panel per network."""
    if run.episodes["rho"].nunique() < 2:
        return []
    frame = slicing.slice_for(run.episodes, free=("rho", "network")).episodes
    nets = [n for n in slicing.networks(frame) if frame[frame["network"] == n]["rho"].nunique() > 1]
    if not nets:
        return []
    figure = Figure(figsize=(4.2 * len(nets), 3.8), layout="constrained")
    axes = figure.subplots(1, len(nets), squeeze=False)[0]
    for ax, net in zip(axes, nets, strict=True):
        part = frame[frame["network"] == net]
        for policy in naming.ordered(part["policy"].unique()):
            rows = part[part["policy"] == policy]
            rhos = slicing.sorted_values(rows, "rho")
            if len(rhos) < 2:
                continue
            stalls = [_median_stall(rows[rows["rho"] == r]) for r in rhos]
            unsafe = naming.is_marked_unsafe(policy)  # dashed and pale: never the best line
            ax.plot([float(str(r)) for r in rhos], stalls, "--x" if unsafe else "-o",
                    label=naming.display_name(policy), color=COLORS.get(policy),
                    alpha=0.55 if unsafe else 1.0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rho (updates per protected action)")
        ax.set_ylabel("median stall (ms/action)")
        ax.set_title(net)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save(figure, directory, "fig_stall_vs_rho")


def trace_specs(run: Run) -> dict[str, dict[str, Any]]:
    """Per network: the traces it replayed, offsets (s) and replayed duration (s).

    The traces are the files the manifest's ``networks`` section recorded (path, the
    direction it was replayed as, the link's own offset, the host that had it), so the
    figure shows what ran, also for a user's own files. Older manifests name traces
    under keys containing "trace" in ``groups`` or ``topologies`` entries; without
    either, the built-in catalogue (``testbed.links.profiles``) is used. Networks without
    traces are left out. Each trace entry: ``ref`` (name or path), ``label``,
    ``direction``, ``path`` (None for a catalogue name), ``offset_s`` (the link's own).
    """
    recorded = _manifest_files(run.manifest)
    listed = _manifest_traces(run.manifest)
    catalogue: dict[str, tuple[str, str]] = {}
    try:
        from testbed.links.profiles import TRACE_PROFILES

        catalogue = dict(TRACE_PROFILES)
    except ImportError:
        catalogue = {}
    specs: dict[str, dict[str, Any]] = {}
    for net in slicing.networks(run.episodes):
        traces = recorded.get(net) or [
            {"ref": n, "label": n, "direction": "down" if n.endswith(".down") else "up",
             "path": None, "offset_s": 0.0}
            for n in (listed.get(net) or list(catalogue.get(net, ())))]
        if not traces:
            continue
        rows = run.episodes[run.episodes["network"] == net]
        wall = rows["wall_s"].dropna() if "wall_s" in rows else pd.Series(dtype=float)
        specs[net] = {
            "traces": traces,
            "offsets_s": [float(str(o)) for o in slicing.sorted_values(rows, "trace_offset_s")],
            "duration_s": float(wall.median()) if len(wall) else 60.0,
        }
    return specs


def _manifest_files(manifest: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Capacity traces per network from the manifest's ``networks`` provenance."""
    out: dict[str, list[dict[str, Any]]] = {}
    networks = manifest.get("networks")
    if not isinstance(networks, dict):
        return out
    for net, entry in networks.items():
        files = entry.get("files", []) if isinstance(entry, dict) else []
        seen: set[tuple[str, str, float]] = set()
        for item in files:
            role = str(item.get("role", ""))
            if role not in ("up_trace", "down_trace"):
                continue
            direction = role.removesuffix("_trace")
            offset = float(item.get("trace_offset_s") or 0.0)
            path = str(item.get("path"))
            if (path, direction, offset) in seen:
                continue
            seen.add((path, direction, offset))
            host = item.get("host")
            label = Path(path).name + (f" (host {host})" if host else "")
            out.setdefault(str(net), []).append(
                {"ref": str(item.get("ref", path)), "label": label, "direction": direction,
                 "path": path, "offset_s": offset,
                 **({"sha256": item["sha256"]} if item.get("sha256") else {})})
    return out


def _manifest_traces(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Trace names per network from the manifest's ``groups`` (runner) or ``topologies``."""
    entries: list[tuple[str, Any]] = []
    for section in ("groups", "topologies"):
        value = manifest.get(section)
        if isinstance(value, dict):
            entries += [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            entries += [("", v) for v in value]
    found: dict[str, list[str]] = {}
    for label, entry in entries:
        if not isinstance(entry, dict):
            continue
        raw_key = entry.get("key")
        key: dict[str, Any] = raw_key if isinstance(raw_key, dict) else {}
        net = entry.get("network") or key.get("network") or entry.get("profile") or label
        names: list[str] = []
        _collect_trace_names({k: v for k, v in entry.items() if k != "hosts"}, names,
                             inside=False)
        if names and net:
            found.setdefault(str(net), [])
            found[str(net)] += [n for n in names if n not in found[str(net)]]
    return found


def _collect_trace_names(value: Any, out: list[str], *, inside: bool) -> None:
    if isinstance(value, str) and inside:
        out.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            tracey = "trace" in str(key) and "offset" not in str(key)
            _collect_trace_names(item, out, inside=inside or tracey)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect_trace_names(item, out, inside=inside)


def _default_loader(entry: dict[str, Any]) -> Any:
    from testbed.links.traces import file_digest, load_named, load_trace, trace_catalogue

    path = entry["path"]
    if path is not None and not Path(path).is_file():  # a run made in another checkout:
        shipped = trace_catalogue().get(Path(path).name)  # the same trace shipped here
        if shipped is not None and entry.get("sha256") == file_digest(shipped)[1]:
            path = shipped
    if path is not None:
        return load_trace(path, direction=entry["direction"])
    return load_named(entry["ref"])


def traces_figure(
    run: Run,
    directory: Path,
    *,
    loader: Callable[[str], Any] | None = None,
    bin_ms: int = 500,
) -> tuple[list[Path], list[str]]:
    """Capacity of the trace segment each network replayed; returns (paths, notes).

    ``loader(ref)`` replaces the file loader (tests)."""
    notes: list[str] = []
    specs = trace_specs(run)
    if not specs:
        return [], notes
    series: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for net, spec in specs.items():
        for entry in spec["traces"]:
            try:
                trace = loader(entry["ref"]) if loader is not None else _default_loader(entry)
                rates = np.asarray(trace.capacity_series_kbit(bin_ms), dtype=float)
            except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
                notes.append(f"trace {entry['label']} ({net}) skipped: {exc}")
                continue
            period_s = len(rates) * bin_ms / 1000.0
            for offset in spec["offsets_s"]:
                start = offset + entry["offset_s"]
                t = np.arange(0.0, spec["duration_s"], bin_ms / 1000.0)
                index = (((start + t) % period_s) * 1000.0 // bin_ms).astype(int)
                index = np.minimum(index, len(rates) - 1)
                series.setdefault(net, []).append(
                    (f"{entry['label']} @ {slicing.number(start)} s", t, rates[index] / 1000.0))
    if not series:
        return [], notes
    figure = Figure(figsize=(8, 2.4 * len(series)), layout="constrained")
    axes = figure.subplots(len(series), 1, squeeze=False)[:, 0]
    for ax, (net, lines) in zip(axes, series.items(), strict=True):
        for label, t, mbit in lines:
            ax.step(t, mbit, where="post", label=label, linewidth=1)
        ax.set_title(f"{net}: capacity during one episode ({bin_ms} ms bins)")
        ax.set_ylabel("Mbit/s")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time since episode start (s)")
    return save(figure, directory, "fig_trace_segments"), notes


FIGURES: Sequence[Callable[[Run, Path], list[Path]]] = (
    winners_figure,
    keys_figure,
    validity_figure,
    rho_figure,
)


def build_figures(run: Run, directory: Path) -> tuple[list[Path], list[str]]:
    """All figures the campaign supports; returns (paths, notes about skipped parts).
    (The link plots are ``testbed.report.link_figures``.)"""
    paths = [p for figure in FIGURES for p in figure(run, directory)]
    trace_paths, notes = traces_figure(run, directory)
    return paths + trace_paths, notes
