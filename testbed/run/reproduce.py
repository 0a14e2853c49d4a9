"""Plan a rerun of a recorded run: same cells, templates and seeds, at the size asked.

Rules this module obeys (docs/reproduce.md):

1. The run to reproduce is a directory written by ``testbed run``: its manifest's
   ``config`` is the normalised campaign, rebuilt with its options
   (``campaign_from_config``; ``recorded_campaign`` would drop them, and options such as
   ``rpc_timeout_s`` or ``derivation`` shape what a rerun measures). A directory that
   is not one is a one-line :class:`UserError` naming what is wrong.
2. ``--templates N`` keeps the run's first N templates in its own order (round robin
   over the families, so small N still spans them); ``--cells FILTER`` keeps the cells
   that match :func:`parse_cell_filter`'s syntax: ``FIELD=V1,V2;FIELD=V3`` (a cell
   matches when, for every field named, its value is one of the values given). Each
   grid slice is cut field by field, so the rerun is an ordinary campaign whose cells
   and episode keys are the recorded ones; schedules depend only on the seed, the
   template and the cell's workload fields, so every episode of the rerun has a
   recorded twin with the same schedule.
3. The rerun's manifest records what it reproduces (:func:`reproduces`): the run's
   path, its revision, a digest of its configuration, the templates and the cells;
   ``--resume`` refuses a directory that reproduces another run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from testbed.campaign.model import STUDY_DEFAULTS, Campaign, Cell, fmt_number
from testbed.campaign.parse import campaign_from_config
from testbed.errors import UserError
from testbed.results.rundir import RunDir

FILTER_SYNTAX = ("FIELD=VALUE[,VALUE...][;FIELD=VALUE...] "
                 "(e.g. policy=planfence,batched_all_key;network=att)")


@dataclass(frozen=True)
class Reference:
    """A recorded run: where it is, its manifest and its campaign (options included)."""

    path: Path
    manifest: Mapping[str, Any]
    campaign: Campaign

    @property
    def name(self) -> str:
        """The run's name: its directory's (how results/claims.toml names it)."""
        return self.path.resolve().name


@dataclass(frozen=True)
class Plan:
    """The rerun: its campaign and what its manifest records (``reproduces``)."""

    reference: Reference
    campaign: Campaign
    cell_filter: str

    def reproduces(self) -> dict[str, Any]:
        git = self.reference.manifest.get("git") or {}
        return {
            "run": str(self.reference.path),
            "revision": git.get("revision") if isinstance(git, Mapping) else None,
            "config_digest": config_digest(self.reference.manifest["config"]),
            "templates": list(self.campaign.templates),
            "of_templates": len(self.reference.campaign.templates),
            "cells": [c.id for c in self.campaign.cells()],
            "of_cells": len(self.reference.campaign.cells()),
            "cell_filter": self.cell_filter,
        }


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of the configuration as canonical JSON (sorted keys)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def read_reference(path: Path) -> Reference:
    """The run under ``path`` (rule 1), or a one-line UserError."""
    allowed = "allowed: a run directory written by `testbed run`"
    if not path.is_dir():
        raise UserError(f"RUN: {path} is not a directory; {allowed}")
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"RUN: {path} has no manifest.json; {allowed}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{manifest_path}: unreadable ({exc}); {allowed}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise UserError(f"{manifest_path}: config: missing or not a table; {allowed}")
    if not (path / "episodes.parquet").is_file():
        raise UserError(f"RUN: {path} has no episodes.parquet (an unfinished run: finish it "
                        "with `testbed run --resume`)")
    try:
        campaign = campaign_from_config(manifest["config"], source=str(manifest_path))
    except UserError as exc:
        raise UserError(f"{manifest_path}: config: {exc}") from None
    return Reference(path, manifest, campaign)


def parse_cell_filter(text: str, fields: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``FIELD=V1,V2;FIELD=V3`` as {field: values} (rule 2); a one-line UserError names
    the part that is wrong."""
    wanted: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, values = part.partition("=")
        name = name.strip()
        items = tuple(v.strip() for v in values.split(",") if v.strip())
        if not sep or not name or not items:
            raise UserError(f"--cells: {part!r} is not allowed; allowed: {FILTER_SYNTAX}")
        if name not in fields:
            raise UserError(f"--cells: field {name!r} is not a grid field of this run; "
                            f"allowed: {', '.join(fields)}")
        if name in wanted:
            raise UserError(f"--cells: field {name!r} is given twice; allowed: each field "
                            "once, its values comma-separated")
        wanted[name] = items
    if not wanted:
        raise UserError(f"--cells: empty; allowed: {FILTER_SYNTAX}")
    return wanted


def _matches(value: Any, given: str) -> bool:
    if isinstance(value, bool) or value is None:
        return str(value).lower() == given.lower()
    if isinstance(value, (int, float)):
        try:
            return float(given) == float(value)
        except ValueError:
            return False
    return str(value) == given


def _text(value: Any) -> str:
    return fmt_number(value) if isinstance(value, (int, float)) and not isinstance(
        value, bool) else str(value)


def cell_matches(cell: Cell, wanted: Mapping[str, tuple[str, ...]]) -> bool:
    return all(any(_matches(getattr(cell, f), v) for v in values) for f, values in wanted.items())


def select_cells(campaign: Campaign, wanted: Mapping[str, tuple[str, ...]],
                 where: str) -> Campaign:
    """The campaign cut to the cells ``wanted`` matches (rule 2); a value that matches no
    cell, or a filter that keeps none, is a one-line UserError."""
    cells = campaign.cells()
    for name, values in wanted.items():
        present = list(dict.fromkeys(_text(getattr(c, name)) for c in cells))
        for value in values:
            if not any(_matches(getattr(c, name), value) for c in cells):
                raise UserError(f"--cells: {name}={value} matches no cell of {where}; its "
                                f"{name} values: {', '.join(present)}")
    grids = []
    for grid in campaign.grids:
        cut = dict(grid)
        for name, values in wanted.items():
            axis = tuple(grid.get(name, STUDY_DEFAULTS.get(name, (None,))))
            cut[name] = tuple(x for x in axis if any(_matches(x, v) for v in values))
        if all(cut[name] for name in wanted):
            grids.append(cut)
    if not grids:
        text = ";".join(f"{k}={','.join(v)}" for k, v in wanted.items())
        raise UserError(f"--cells: {text} matches no cell of {where} (no cell has all of "
                        "these values at once)")
    selected = replace(campaign, grids=tuple(grids))
    kept = {c.id for c in selected.cells()}
    assert kept <= {c.id for c in cells}, "a cut grid made a cell the run does not have"
    return selected


def plan(reference: Reference, *, templates: int | None = None,
         cells: str | None = None) -> Plan:
    """The rerun of ``reference`` at ``templates`` (its first N; default: all of them) and
    the cells ``cells`` keeps (default: all)."""
    campaign = reference.campaign
    total = len(campaign.templates)
    if templates is not None:
        if not 1 <= templates <= total:
            raise UserError(f"--templates: {templates} is out of range; allowed: 1 to "
                            f"{total} (the templates of {reference.path})")
        campaign = replace(campaign, templates=campaign.templates[:templates])
    if cells is not None:
        campaign = select_cells(campaign, parse_cell_filter(cells, campaign.fields),
                                str(reference.path))
    return Plan(reference, campaign, cells or "")


def check_out(out: Path, rerun: Plan, *, resume: bool) -> None:
    """Refuse an ``--out`` that is the run itself, holds something unless ``resume``, or
    (with ``resume``) holds a reproduction of another run (rule 3)."""
    if out.resolve() == rerun.reference.path.resolve():
        raise UserError(f"--out: {out} is the run being reproduced; allowed: another "
                        "directory (default reproduce/<run name>)")
    run_dir = RunDir(out)
    if run_dir.is_empty():
        return
    if not resume:
        raise UserError(f"--out: {out} is not empty; pass --resume to finish that "
                        "reproduction, or choose another --out")
    try:
        manifest = run_dir.read_manifest()
    except (OSError, ValueError) as exc:
        raise UserError(f"--out: {run_dir.manifest_path}: unreadable ({exc})") from None
    recorded = manifest.get("reproduces")
    if isinstance(recorded, Mapping):
        mine = rerun.reproduces()
        if recorded.get("config_digest") != mine["config_digest"]:
            raise UserError(f"--resume: {out} reproduces another run ({recorded.get('run')}); "
                            "choose another --out")
        for field, flag in (("templates", "--templates"), ("cells", "--cells")):
            if list(recorded.get(field) or []) != mine[field]:
                raise UserError(
                    f"--resume: {out} reproduces {recorded.get('run')} with "
                    f"{len(recorded.get(field) or [])} {field}, not {len(mine[field])}; pass "
                    f"the {flag} it was started with, or choose another --out")


def record(out: Path, rerun: Plan) -> None:
    """Write ``reproduces`` into the rerun's manifest (rule 3) once the manifest is this
    rerun's (a run refused before it started leaves the directory as it was)."""
    run_dir = RunDir(out)
    if not run_dir.manifest_path.is_file():
        return
    try:
        manifest = run_dir.read_manifest()
    except (OSError, ValueError):
        return
    if manifest.get("config") == rerun.campaign.config():
        run_dir.update_manifest(reproduces=rerun.reproduces())


def default_out(reference: Reference) -> Path:
    return Path("reproduce") / reference.name

