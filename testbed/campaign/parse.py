"""Campaign files: TOML in, a validated :class:`Campaign` out, or a one-line error.

Rules this module obeys:

1. A campaign file is validated completely before anything runs; every error is one
   line naming the field and the allowed values (:class:`CampaignError`).
2. The allowed values come from ``testbed.campaign.vocabulary`` (the registries), never
   from a list kept here.
3. Presets are campaign files shipped in ``testbed/campaign/presets/``; a name that is not
   a file is looked up there.
4. ``[networks.NAME]`` tables define the campaign's own networks
   (``testbed.campaign.networks``); ``grid.network`` names registered or defined ones, and
   the networks are checked against the grid (hosts, trace offsets) and their files
   read before the campaign is returned.
5. ``plugins = [...]`` are loaded before anything else is checked
   (``testbed.campaign.plugins``); ``[policies.NAME]`` tables set a policy's parameters
   for every cell naming it, and each cell's policy is written in its one spelling
   (``protocols.policy_params.canonical_spec``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from testbed.campaign.command import COMMAND_KIND
from testbed.campaign.command_table import parse_command
from testbed.campaign.live_parse import live_fields
from testbed.campaign.model import Campaign, CampaignError
from testbed.campaign.networks import check_against_grid, check_backend
from testbed.campaign.plugins import load as load_plugins
from testbed.campaign.plugins import resolve_names
from testbed.campaign.schema import validate_campaign

PRESETS_PACKAGE = "testbed.campaign"


def preset_names() -> list[str]:
    folder = resources.files(PRESETS_PACKAGE) / "presets"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir()
                  if p.name.endswith(".toml"))


def load_campaign(name_or_path: str | Path) -> Campaign:
    """Load a shipped preset by name, or a campaign file by path."""
    text = str(name_or_path)
    path = Path(text)
    if path.is_file():
        return _parse_text(_read_text(path), str(path), base_dir=path.resolve().parent)
    presets = preset_names()
    if text in presets:
        preset = resources.files(PRESETS_PACKAGE) / "presets" / f"{text}.toml"
        return _parse_text(preset.read_text(), f"preset {text}")
    if path.is_dir():
        kind = "a directory; give the campaign's .toml file in it"
    elif text.endswith(".toml") or "/" in text:
        kind = "not a file (no such file)"
    else:
        kind = "neither a file nor a preset"
    raise CampaignError(f"campaign: {text!r} is {kind}; presets: {', '.join(presets)}")


def _read_text(path: Path) -> str:
    """A campaign file's text: UTF-8 (a byte order mark is dropped), one line if not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CampaignError(f"campaign: {path}: unreadable ({exc.strerror})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise CampaignError(f"campaign: {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
                            f"at offset {exc.start}); save it as UTF-8") from None


def _parse_text(text: str, source: str, *, base_dir: Path | None = None) -> Campaign:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CampaignError(f"{source}: invalid TOML: {exc}") from None
    return parse_campaign(data, source=source, base_dir=base_dir)


def parse_campaign(data: Mapping[str, Any], *, source: str = "<campaign>",
                   base_dir: Path | None = None, check_files: bool = True,
                   plugins: Sequence[str] = ()) -> Campaign:
    """Validate a decoded campaign table (see docs/campaigns.md for the format).

    ``base_dir``: where relative trace paths of ``[networks]`` start (the campaign
    file's folder). Without ``check_files`` trace files are neither read nor checked
    against the grid (reading back a manifest's campaign for its cells).
    """
    named: tuple[str, ...] = ()
    if isinstance(data, Mapping):  # plugins register policies the grid may name (rule 5)
        named = resolve_names(data.get("plugins", []), base_dir=base_dir)
        named = tuple(dict.fromkeys([*named, *plugins]))
        load_plugins(named)
    checked = validate_campaign(data, base_dir=base_dir, check_files=check_files)
    kind, grids = checked.kind, checked.grid
    model, decisions = live_fields(data, kind, checked.templates, grids, base_dir=base_dir,
                                   check_files=check_files)
    command = None
    if kind == COMMAND_KIND:
        command = parse_command(data.get("command"), base_dir=base_dir,
                                agents=min(min(g["agents"]) for g in grids))
    options = checked.options.options()
    campaign = Campaign(name=checked.name, seed=int(checked.seed),
                        templates=tuple(checked.templates), grids=grids, options=options,
                        description=checked.description, source=source, kind=kind,
                        execution=checked.execution.execution(), networks=checked.networks or {},
                        plugins=named, model=model, decisions=decisions, command=command)
    if check_files:
        check_against_grid(campaign)
        check_backend(campaign, options.backend, final=False)  # --backend may say sim
    return campaign


def recorded_campaign(config: Mapping[str, Any], *, source: str = "<manifest>") -> Campaign:
    """The campaign a manifest's ``config`` describes, for its cells and templates.

    Options are left out: the manifest stores every option, unset ones as None, which a
    campaign file may not say, and options shape neither cells nor schedules. Trace
    files are not read (the run's manifest has their digests)."""
    return parse_campaign({**config, "options": {}}, source=source, check_files=False)


def campaign_from_config(config: Mapping[str, Any], *, source: str = "<config>") -> Campaign:
    """The campaign ``Campaign.config()`` describes, options included (a cluster worker
    rebuilds the campaign it runs from this)."""
    options = {k: v for k, v in dict(config.get("options") or {}).items() if v is not None}
    return parse_campaign({**config, "options": options}, source=source)
