"""Policy plugins: find them, import them, say where they came from.

Rules:

1. A plugin is a module that registers policies (``protocols.api``): named on a campaign
   (``plugins = [...]``) or the command line (``--plugin``) as a module on ``sys.path``
   or a ``.py`` file path, or installed by a distribution under the entry-point group
   ``planfence_testbed.policies`` (``importlib.metadata``; the entry point names a module,
   or ``module:Class`` for one policy class, registered if it is not yet).
2. Loading is all or nothing per plugin and refused with one line naming the plugin
   (:class:`PluginError`): an import that fails, a policy name that collides with a
   built-in or another plugin's, an RPC name that collides, a bad schema or parameter
   declaration. Importing twice is a no-op (the controller and every node import the
   same plugins; a node process imports them before it serves).
3. Every plugin has an identity for the manifest (:class:`PluginInfo`): its
   distribution name and version (None for a loose module) and the SHA-256 of its
   source (the module file, or every ``.py`` file of its package, in path order), so a
   resumed run can refuse a changed plugin.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from protocols.api import ENTRY_POINT_GROUP
from protocols.policies.base import Policy
from protocols.policies.registry import policy_names, register

_LOADED: dict[str, PluginInfo] = {}


class PluginError(Exception):
    """A plugin cannot be used; the message is one line naming it."""


@dataclass
class PluginInfo:
    name: str  # as named (module, file path or entry point "dist:name")
    module: str
    distribution: str | None
    version: str | None
    source_sha256: str
    policies: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "distribution": self.distribution,
                "version": self.version, "source_sha256": self.source_sha256,
                "policies": list(self.policies)}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, ValueError) else text


def _file_module(path: Path) -> str:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
    return f"planfence_plugin_{path.stem}_{digest}"


def _import(name: str) -> ModuleType:
    if name.endswith(".py") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise PluginError(f"plugin {name!r}: no such file")
        module_name = _file_module(path)
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path.resolve())
        if spec is None or spec.loader is None:
            raise PluginError(f"plugin {name!r}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module
    return importlib.import_module(name)


def source_digest(module: ModuleType) -> str:
    """SHA-256 over a module's source: its file, or every .py file of its package."""
    origin = getattr(module, "__file__", None)
    if origin is None:
        return ""
    path = Path(origin)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for item in files:
        digest.update(str(item.relative_to(path.parent)).encode() + b"\0")
        digest.update(item.read_bytes())
    return digest.hexdigest()


def _distribution_of(module: str) -> tuple[str | None, str | None]:
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    if not names:
        return None, None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return names[0], None


def load_plugin(name: str, *, distribution: tuple[str | None, str | None] | None = None,
                loader: Any = None) -> PluginInfo:
    """Import one plugin (rule 2) and return its identity (rule 3)."""
    if name in _LOADED:
        return _LOADED[name]
    before = set(policy_names())
    try:
        if loader is not None:
            obj = loader()
            if isinstance(obj, type) and issubclass(obj, Policy) \
                    and obj.name not in policy_names():
                register(obj)
            module = sys.modules[obj.__module__] if not isinstance(obj, ModuleType) else obj
        else:
            module = _import(name)
    except PluginError:
        raise
    except (Exception, SystemExit) as exc:  # an import runs the plugin's code
        raise PluginError(f"plugin {name!r}: {_one_line(exc)}") from exc
    new = sorted(set(policy_names()) - before)
    dist, version = distribution or _distribution_of(module.__name__)
    info = PluginInfo(name=name, module=module.__name__, distribution=dist, version=version,
                      source_sha256=source_digest(module), policies=new)
    _LOADED[name] = info
    return info


def _entry_points() -> list[tuple[str, tuple[str, str] | None, Any]]:
    """(label ``dist:name``, distribution identity, loader) of every installed plugin."""
    out = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                     key=lambda e: e.name):
        dist = ep.dist
        ident = (dist.metadata["Name"], dist.version) if dist is not None else None
        out.append((f"{ident[0] if ident else '?'}:{ep.name}", ident, ep.load))
    return out


def entry_point_plugins() -> list[PluginInfo]:
    """Load every installed plugin of the entry-point group (rule 1)."""
    return [load_plugin(label, distribution=ident, loader=loader)
            for label, ident, loader in _entry_points()]


def check_entry_point_plugins() -> list[PluginInfo | PluginError]:
    """Try every installed plugin, each on its own: what loaded, and the one-line error
    of each that did not (``testbed doctor``: one broken plugin fails every campaign,
    since every campaign loads them all)."""
    out: list[PluginInfo | PluginError] = []
    for label, ident, loader in _entry_points():
        try:
            out.append(load_plugin(label, distribution=ident, loader=loader))
        except PluginError as exc:
            out.append(exc)
    return out


def load_plugins(names: Sequence[str] = (), *, entry_points: bool = True) -> list[PluginInfo]:
    """Entry-point plugins (if ``entry_points``), then ``names`` in order."""
    infos = entry_point_plugins() if entry_points else []
    return [*infos, *(load_plugin(n) for n in names)]


def loaded_plugins() -> list[PluginInfo]:
    return list(_LOADED.values())


def plugin_of(policy: str) -> PluginInfo | None:
    """The loaded plugin that registered ``policy`` (None: built-in or registered by hand)."""
    return next((p for p in _LOADED.values() if policy in p.policies), None)
