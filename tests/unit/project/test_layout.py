"""The package layout keeps its promises: a pure core, no import cycles, no tooling in the
product, modules of a readable size. Checked on the source's import statements (every
import, at module level or inside a function), so a lazy import cannot hide a dependency."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from tests.support.paths import ROOT

PRODUCT = "cursorsync"
DEVTOOLS = "cursorsync_devtools"
#: Each distribution's source root: the product's, and the development tools' of their own.
SRC = {PRODUCT: ROOT / "streaming", DEVTOOLS: ROOT / "streaming" / "devtools"}
#: What the pure core may import besides itself and the standard library.
CORE_ALLOWED = {"numpy"}
#: Generated protobuf modules are not written by hand: their size says nothing.
GENERATED = "_proto"
MAX_LINES = 500


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    """``package``'s modules (``cursorsync/core`` for a subpackage), by name."""
    src = SRC[package.split("/")[0]]
    paths = sorted((src / package).rglob("*.py"))
    assert paths, f"no modules under {src / package}"
    for path in paths:
        if GENERATED in path.parts:
            continue
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, absolute, wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            # ``from pkg import mod`` imports a module too.
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def _graph(package: str) -> dict[str, set[str]]:
    modules = dict(_modules(package))
    graph = {}
    for name, path in modules.items():
        deps = {d for d in _imports(name, path) if d in modules and d != name}
        graph[name] = deps
    return graph


def test_the_core_imports_only_the_standard_library_numpy_and_itself() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = {}
    for name, path in _modules(f"{PRODUCT}/core"):
        for dep in _imports(name, path):
            top = dep.split(".")[0]
            if top in stdlib or top in CORE_ALLOWED:
                continue
            if dep.startswith((f"{PRODUCT}.core", f"{PRODUCT}.errors")) or dep == PRODUCT:
                continue
            bad.setdefault(name, set()).add(dep)
    assert not bad, f"the core must stay pure (no Spark, Pulsar, Delta, Prometheus): {bad}"


def test_the_product_never_imports_the_development_tools() -> None:
    bad = {name: sorted(d for d in _imports(name, path) if d.split(".")[0] == DEVTOOLS)
           for name, path in _modules(PRODUCT)}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{PRODUCT} must run without {DEVTOOLS}: {bad}"


#: The product's layers, lowest first: a module imports only its own layer's modules and
#: lower layers'. The two in a layer are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core", "errors", "files", "gc_pause", "phases", "wake", "_proto"),
    ("pulsar", "tables"),
    ("mapping", "sync"),
    ("app",),
)


def _layer(module: str) -> tuple[int, str]:
    """A product module's layer and the part of the package it belongs to."""
    part = module.split(".")[1] if "." in module else ""
    for rank, parts in enumerate(LAYERS):
        if part in parts:
            return rank, part
    return -1, part  # the package's own __init__ and __main__: above everything


def test_the_layers_point_one_way() -> None:
    """core < pulsar, tables < mapping, sync < app: what the queries need of the settings
    and the metrics is handed to them, and pulsar and tables, mapping and sync never
    import each other."""
    bad = []
    for name, deps in _graph(PRODUCT).items():
        rank, part = _layer(name)
        if rank < 0:
            continue
        for dep in deps - {PRODUCT}:  # ``from cursorsync import gc_pause`` names the module
            dep_rank, dep_part = _layer(dep)
            if dep_rank < 0 or dep_rank > rank or (dep_rank == rank and dep_part != part
                                                   and rank > 0):
                bad.append(f"{name} -> {dep}")
    assert not bad, "imports against the layers: " + "; ".join(sorted(bad))


def _discovered(pyproject: Path) -> set[str]:
    """The packages setuptools' discovery finds from ``pyproject``'s settings (namespaces
    on, as ``[tool.setuptools.packages.find]`` has them by default)."""
    find = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]
    where = pyproject.parent / find["where"][0]
    return set(find_namespace_packages(str(where), include=find.get("include", ("*",)),
                                       exclude=find.get("exclude", ())))


def test_the_product_distribution_leaves_the_development_tools_out() -> None:
    product = _discovered(ROOT / "pyproject.toml")
    assert {PRODUCT, f"{PRODUCT}.core", f"{PRODUCT}.app"} <= product
    strays = sorted(p for p in product if p != PRODUCT and not p.startswith(f"{PRODUCT}."))
    assert not strays, f"the product's wheel would ship {strays}"
    devtools = _discovered(SRC[DEVTOOLS] / "pyproject.toml")
    assert {DEVTOOLS, f"{DEVTOOLS}.testbed", f"{DEVTOOLS}.sim"} <= devtools
    assert all(p == DEVTOOLS or p.startswith(f"{DEVTOOLS}.") for p in devtools), devtools


@pytest.mark.parametrize("package", [PRODUCT, DEVTOOLS])
def test_no_import_cycles(package: str) -> None:
    graph = _graph(package)
    # Packages import their own modules from __init__; an edge into a package from one of
    # its own modules is how Python resolves the name, not a dependency of the design.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")


@pytest.mark.parametrize("package", [PRODUCT, DEVTOOLS])
def test_no_module_is_too_long_to_read(package: str) -> None:
    long = {name: n for name, path in _modules(package)
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"
