"""A campaign's policy plugins: loaded before its grid is checked, recorded in the manifest.

Rules:

1. ``plugins = [...]`` in a campaign file (and ``--plugin`` on the command line) names
   modules on ``sys.path`` or ``.py`` files (relative to the campaign file's folder);
   installed entry-point plugins are loaded too (``nodes.plugins``). A plugin that
   cannot be used is one ``CampaignError`` line naming it, before anything starts (an
   installed one a ``HostError``: the installation's fault, whatever the campaign).
2. The manifest records, per plugin that registered a policy the campaign runs (and
   per plugin the campaign names), its distribution, version and source SHA-256;
   ``--resume``/``--extend`` refuse a run whose plugin is gone or changed.
3. A report loads the plugins its run recorded, where they still import, so that their
   policies get their registered titles and categories; one that does not import is
   left out with a note (the report keeps the policy's name), never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nodes.plugins import (
    PluginError,
    entry_point_plugins,
    load_plugin,
    load_plugins,
    loaded_plugins,
    plugin_of,
)
from testbed.campaign.model import Campaign, CampaignError
from testbed.errors import HostError


def resolve_names(names: Any, *, base_dir: Path | None, where: str = "plugins"
                  ) -> tuple[str, ...]:
    """Plugin names as written, file paths made absolute (relative to ``base_dir``)."""
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise CampaignError(f"{where}: {names!r} is not allowed; allowed: a list of module "
                            "names or .py file paths")
    out = []
    for name in names:
        if name.endswith(".py") or "/" in name:
            path = Path(name)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            name = str(path.resolve())
        out.append(name)
    return tuple(dict.fromkeys(out))


def load(names: Sequence[str], *, where: str = "plugins") -> None:
    """Load entry-point plugins and ``names`` (rule 1). An installed plugin that cannot
    be loaded is this host's installation's fault (``HostError``), not the campaign's."""
    try:
        entry_point_plugins()
    except PluginError as exc:
        raise HostError(f"installed policy {exc}; fix or uninstall it (`testbed doctor` "
                        "checks every installed plugin)") from None
    try:
        load_plugins(names, entry_points=False)
    except PluginError as exc:
        raise CampaignError(f"{where}: {exc}") from None


def provenance(campaign: Campaign) -> dict[str, dict[str, Any]]:
    """What the manifest records of the campaign's plugins (rule 2)."""
    used = {cell.policy.split("/")[0] for cell in campaign.cells()}
    out: dict[str, dict[str, Any]] = {}
    for info in loaded_plugins():
        if info.name in campaign.plugins or used & set(info.policies):
            out[info.name] = info.to_dict()
    for name in sorted(used):
        origin = plugin_of(name)
        if origin is not None:
            out.setdefault(origin.name, origin.to_dict())
    return out


def changed(recorded: Mapping[str, Any]) -> str | None:
    """Why a recorded plugin no longer matches what is loaded (None: all the same)."""
    current = {p.name: p for p in loaded_plugins()}
    for name, old in sorted(recorded.items()):
        info = current.get(name)
        why = "it is not loaded"
        if info is None and isinstance(old, Mapping) and old.get("module"):
            try:
                info = load_plugin(name)
            except PluginError as exc:
                why = str(exc)
        if info is None:
            return f"plugin {name!r} of the recorded run cannot be used now ({why})"
        if isinstance(old, Mapping) and old.get("source_sha256") != info.source_sha256:
            return (f"plugin {name!r} changed since the run was recorded (source SHA-256 "
                    f"{str(old.get('source_sha256'))[:12]} then, {info.source_sha256[:12]} "
                    "now); rerun into another --out")
    return None


def load_recorded(recorded: Mapping[str, Any]) -> list[str]:
    """Load the plugins a run's manifest recorded (rule 3); notes on those left out."""
    notes: list[str] = []
    for name, old in sorted(recorded.items()):
        if not isinstance(old, Mapping):
            continue
        module = str(old.get("module") or "")
        target = name if (name.endswith(".py") or "/" in name) else module
        if not target:
            continue
        try:
            load_plugins([target])
        except PluginError as exc:
            notes.append(f"plugin {name!r} of the run was not loaded ({exc}); its policies "
                         "keep their names")
    return notes
