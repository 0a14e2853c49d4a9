"""The campaign fields of live workflows and recorded-decision replay (parsing only).

Rules (``testbed.campaign.parse`` rule 1 holds here too: one line naming the field):

1. ``[model]`` belongs to ``kind = "live"`` campaigns only; a live campaign without one
   uses the defaults of :class:`testbed.campaign.endpoint.ModelSettings` (the stand-in
   server's address, ``testbed model-server``).
2. ``decisions = "path/to/live-run"`` belongs to replay campaigns only (every other kind);
   a relative path starts at the campaign file's folder. A manifest's config holds the
   path and the digest of the decisions it replayed; reading it back checks the digest,
   so a resumed run never mixes two sets of decisions.
3. A live task needs a planner, an executor and an auditor: ``agents`` >= 3.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.campaign.decisions import RecordedDecisions, load_recorded
from testbed.campaign.endpoint import ModelSettings, model_from_data, parse_model
from testbed.campaign.live import LIVE_KIND
from testbed.campaign.model import Campaign, CampaignError
from testbed.campaign.workload import template_family


def live_fields(data: Mapping[str, Any], kind: str, templates: Sequence[str],
                grids: Sequence[Mapping[str, tuple[Any, ...]]], *,
                base_dir: Path | None, check_files: bool
                ) -> tuple[ModelSettings | None, RecordedDecisions | None]:
    """The ``[model]`` table and the ``decisions`` field of a campaign (rules 1-3)."""
    model = None
    if kind == LIVE_KIND:
        raw = data.get("model", {})
        # A manifest's config writes every field, an unset seed as null (TOML has none).
        model = model_from_data(raw) if isinstance(raw, Mapping) else parse_model(raw)
        for i, grid in enumerate(grids):
            small = [a for a in grid.get("agents", ()) if a < 3]
            if small:
                where = "grid" if len(grids) == 1 else f"grid[{i}]"
                raise CampaignError(f"{where}.agents: {small[0]} is not allowed in a live "
                                    "campaign; allowed: integers >= 3 (planner, executor, "
                                    "auditor)")
        if "decisions" in data:
            raise CampaignError("decisions: only for replay campaigns (kind episodes, "
                                "replanning, handoff); a live campaign makes its decisions")
    elif "model" in data:
        raise CampaignError(f"model: only for kind = {LIVE_KIND!r} campaigns; this "
                            f"campaign's kind is {kind!r}")
    decisions = None
    if kind != LIVE_KIND and "decisions" in data:
        decisions = _decisions(data["decisions"], templates, base_dir, check_files)
    return model, decisions


def _decisions(value: Any, templates: Sequence[str], base_dir: Path | None,
               check_files: bool) -> RecordedDecisions | None:
    recorded_digest = None
    if isinstance(value, Mapping):  # read back from a manifest's config
        recorded_digest = value.get("digest")
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise CampaignError(f"decisions: {value!r} is not allowed; allowed: the path of a "
                            "live run's results directory")
    path = Path(value)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    families = sorted({template_family(t) for t in templates})
    if not check_files and not path.is_dir():
        return RecordedDecisions(str(path), {}, str(recorded_digest or ""))
    decisions = load_recorded(path, families=families)
    if recorded_digest is not None and decisions.digest != recorded_digest:
        raise CampaignError(f"decisions: the recorded decisions under {decisions.path} have "
                            "changed since this run started (digest differs)")
    return decisions


def with_endpoint(campaign: Campaign, *, base_url: str | None = None,
                  model: str | None = None) -> Campaign:
    """The campaign pointed at another endpoint (``testbed run --model-url --model``);
    the fields are checked as ``[model]`` fields are."""
    if campaign.kind != LIVE_KIND or campaign.model is None:
        raise CampaignError(f"--model-url/--model: only for kind = {LIVE_KIND!r} campaigns; "
                            f"{campaign.name!r} is of kind {campaign.kind!r}")
    changed = {k: v for k, v in (("base_url", base_url), ("model", model)) if v is not None}
    data = {k: v for k, v in {**campaign.model.to_data(), **changed}.items() if v is not None}
    return dataclasses.replace(campaign, model=parse_model(data))
