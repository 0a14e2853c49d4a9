"""The house rules of the code base, checked on the source (no imports run).

1. Imports run one way between the top-level packages: testbed -> nodes -> protocols.
2. Inside testbed/, each stage imports only the stages below it (``STAGES``), and no
   module imports another in a cycle (imports inside functions count too;
   ``from pkg import sub`` counts as importing ``pkg`` itself as well as ``sub``).
3. No product module imports from scripts/ or tests/.
4. No product module reads or writes a private attribute (``obj._name``) that is
   defined in another module of the project.
5. Every product module stays under 500 lines.
6. docs/architecture.md's module map names every product module.
7. ``protocols/`` does no I/O: it imports no module that reaches files, sockets,
   processes, clocks or the import system, and calls no ``open``.
8. No test spells out a registry: no literal in tests/ (a list, tuple or set of strings,
   a dict's keys, or one string) names every registered policy or every built-in
   network. Tests take such lists from the registries (``tests/names.py``), so the
   recipes "add a policy" and "add a network profile" of docs/architecture.md pass
   the suite without editing a test. A frozen historical record may stay if the line
   that opens it says ``# frozen record``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocols", "nodes", "testbed")
MAX_LINES = 500

#: testbed stage -> the stages it may import (besides itself and testbed/__init__).
STAGES: dict[str, set[str]] = {
    "errors": set(),
    "interrupts": set(),
    "host": {"errors"},
    "links": {"errors", "host"},
    "net": {"errors", "interrupts", "host", "links"},
    "campaign": {"errors", "links"},
    "results": {"errors", "campaign"},
    "report": {"errors", "links", "campaign", "results"},
    "run": {"errors", "interrupts", "host", "links", "net", "campaign", "results"},
    "tools": {"errors", "interrupts", "host", "links", "net", "campaign", "results", "run",
              "report"},
    "sim": {"errors", "interrupts", "host", "links", "net", "campaign", "results", "run",
            "report", "tools"},
    "api": {"errors", "interrupts", "host", "links", "net", "campaign", "results", "run",
            "report", "tools", "sim"},
    "cli": {"errors", "interrupts", "host", "links", "net", "campaign", "results", "run",
            "report", "tools", "sim", "api"},
    "__main__": {"cli"},
}
#: top-level package -> the project packages it may import.
TOP: dict[str, set[str]] = {"protocols": set(), "nodes": {"protocols"},
                            "testbed": {"nodes", "protocols"}}


def product_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> Iterator[str]:
    """Absolute names of every project module ``path`` imports (at any depth)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            yield base  # `from pkg import sub` runs (and reads) pkg/__init__ too
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if _is_module(candidate):
                    yield candidate


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _project(name: str) -> bool:
    return name.split(".")[0] in (*PACKAGES, "scripts", "tests")


def _stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "testbed" and len(parts) > 1 else None


def test_top_level_packages_import_one_way() -> None:
    bad = []
    for path in product_files():
        top = module_name(path).split(".")[0]
        for name in imported_modules(path):
            other = name.split(".")[0]
            if _project(name) and other != top and other not in TOP[top]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_testbed_stages_import_only_downward() -> None:
    bad = []
    for path in product_files():
        here = module_name(path)
        stage = _stage(here)
        if here.split(".")[0] != "testbed" or stage is None:
            continue
        assert stage in STAGES, f"{path.relative_to(ROOT)}: stage {stage!r} missing from STAGES"
        for name in imported_modules(path):
            other = _stage(name)
            if name.startswith("testbed") and other not in (None, stage) \
                    and other not in STAGES[stage]:
                bad.append(f"{path.relative_to(ROOT)} ({stage}) imports {name} ({other})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for path in product_files():
        here = module_name(path)
        graph[here] = {n for n in imported_modules(path) if _project(n) and n != here}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_product_module_imports_scripts_or_tests() -> None:
    bad = [f"{p.relative_to(ROOT)} imports {n}" for p in product_files()
           for n in imported_modules(p) if n.split(".")[0] in ("scripts", "tests")]
    assert not bad, "\n".join(bad)
    texts = [p for p in product_files() if "scripts/" in p.read_text() and
             "spec_from_file_location" in p.read_text()]
    assert not texts, f"modules loading files from scripts/: {texts}"


def _private_names_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: attributes it assigns, class fields, functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_attribute_of_another_module() -> None:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in product_files()}
    defined = {p: _private_names_defined(t) for p, t in trees.items()}
    everywhere = set().union(*defined.values())
    bad = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if attr in everywhere and attr not in defined[path]:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses .{attr}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines < MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (keep under {MAX_LINES})"


def test_the_architecture_map_names_every_product_module() -> None:
    """docs/architecture.md's module map is the newcomer's map: every module is on it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in product_files()
               if p.stem not in ("__init__", "__main__")
               and p.parent.name != "policies"  # one file per policy: docs/policies.md
               and f"{p.stem}.py" not in text and f"`{p.stem}`" not in text]
    assert not missing, "modules missing from docs/architecture.md's map: " + ", ".join(missing)


def registered_policies() -> set[str]:
    """Policy names as the policy modules declare them (``name = "..."`` of a class
    decorated with ``@register``), read from the source."""
    names = set()
    for path in (ROOT / "protocols" / "policies").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list):
                for stmt in node.body:
                    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                            and isinstance(stmt.targets[0], ast.Name)
                            and stmt.targets[0].id == "name"
                            and isinstance(stmt.value, ast.Constant)):
                        names.add(str(stmt.value.value))
    return names


def builtin_networks() -> set[str]:
    presets = ROOT / "testbed" / "links" / "presets" / "networks.toml"
    return set(tomllib.loads(presets.read_text())["networks"])


def _names_in(node: ast.AST) -> set[str] | None:
    """The names a literal spells out (None: not a literal of names)."""
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return set(re.findall(r"[a-z][a-z0-9_]*", node.value))
    return None


def spelled_out_registries(path: Path, registries: dict[str, set[str]]) -> list[str]:
    """``file:line: every <registry>`` for each literal of PATH naming a whole registry."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        names = _names_in(node)
        if not names or "# frozen record" in lines[getattr(node, "lineno", 1) - 1]:
            continue
        for what, registry in registries.items():
            if registry <= names:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{where}:{getattr(node, 'lineno', 1)}: every {what}")
    return found


def test_no_test_spells_out_a_registry() -> None:
    registries = {"policy": registered_policies(), "built-in network": builtin_networks()}
    assert len(registries["policy"]) >= 10
    assert {"loopback", "att"} <= registries["built-in network"]
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py"))
             for hit in spelled_out_registries(path, registries)]
    assert not found, ("tests spell out a registry (take the names from tests/names.py): "
                       + "; ".join(found))


def test_the_registry_check_finds_a_spelled_out_list(tmp_path: Path) -> None:
    registries = {"network": {"loopback", "att"}}
    probe = tmp_path / "probe.py"
    probe.write_text('NETS = ["loopback", "att"]\nOK = ["att"]\n'
                     'MSG = "allowed: loopback, att"\n'
                     'OLD = ("loopback", "att")  # frozen record\n'
                     'TABLE = {"loopback": 1, "att": 2}\n')
    assert spelled_out_registries(probe, registries) == [
        "probe.py:1: every network", "probe.py:3: every network", "probe.py:5: every network"]


#: Standard modules through which code reaches the world outside the process's objects.
IO_MODULES = {"os", "io", "socket", "sqlite3", "subprocess", "pathlib", "shutil", "tempfile",
              "time", "select", "selectors", "asyncio", "importlib", "signal", "urllib",
              "http", "ssl", "mmap", "fcntl", "glob", "logging"}


def test_protocols_does_no_io() -> None:
    bad = []
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                    if n.split(".")[0] in IO_MODULES]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "open":
                bad.append(f"{path.relative_to(ROOT)} calls open()")
    assert not bad, "\n".join(bad)
