"""The shape of the code, checked from its imports (no module is imported here).

- no import circle among a package's modules (every import counts: deferred ones inside functions,
  and type-only ones under ``if TYPE_CHECKING:``; deferring an import hides a circle from Python, not
  from the reader, and a type names a dependency too);
- no module of ``lms/`` or ``tuner/`` over 500 lines;
- no ``from x import _private`` across modules: what another module needs is public where it lives;
- tuner/ by role: at most 12 modules flat at its root, the rest in packages whose ``__init__``
  docstring is their map (it names each of the package's modules).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lms", "tuner")
MAX_LINES = 500
#: Modules directly under tuner/ (``__init__.py`` and ``__main__.py`` counted): the rest live in packages by role.
MAX_TUNER_ROOT_MODULES = 12


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


ALL = {name: path for package in PACKAGES for name, path in _modules(package).items()}


def _is_package(module: str) -> bool:
    return ALL[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.Module):
    """Every import statement: at module level, deferred inside a function (a deferred import still
    makes the importer depend on the imported) or under ``if TYPE_CHECKING:`` (the annotations that
    need it name the imported module's types: the importer depends on it as much)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            stack.extend(ast.iter_child_nodes(node))


def _edges(module: str) -> set[str]:
    """Project modules that ``module`` imports."""
    tree = ast.parse(ALL[module].read_text())
    targets: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            source = _resolve(module, node)
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in ALL else source for alias in node.names]
        for name in names:
            # importing a.b.c runs a, a.b and a.b.c; the edge that matters is the deepest project module
            while name and name not in ALL:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    # a package's __init__ is run before any of its modules: that edge is implied, not a circle
    return {t for t in targets if not module.startswith(t + ".")}


def _graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports."""
    members = {m for m in ALL if m == package or m.startswith(package + ".")}
    return {m: _edges(m) & members for m in sorted(members)}


def _circles(package: str, graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """The import circles of `package` (or of `graph`): its strongly connected components of more than one
    module, sorted."""
    graph = _graph(package) if graph is None else graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One walk around a circle: from the component's first module, the shortest way back to it."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{component} is not a circle")


def describe_circles(package: str) -> list[str]:
    """Each circle of `package`: one walk around it, then every import between its modules."""
    graph = _graph(package)
    out = []
    for component in _circles(package):
        inside = "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(component)))}" for m in component)
        out.append(f"{' -> '.join(_circle_path(graph, component))}  (imports inside: {inside})")
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph = _graph(package)
    assert sum(len(targets) for targets in graph.values()) > 50  # the edges were found
    circles = describe_circles(package)
    assert not circles, f"import circles in {package}/ (type-only imports count):\n" + "\n".join(circles)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_500_lines(package):
    long = {m: n for m, p in _modules(package).items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_imported_across_modules(package):
    found = []
    for module, path in _modules(package).items():
        for node in _imports(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, node)
            if source == module or source.split(".")[0] not in PACKAGES:
                continue  # a third party's private name is its business (docs/tf-notes.md: TF's we rely on)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{module}: from {source} import {alias.name}")
    assert found == []


def _package_graph(package: str) -> dict[str, set[str]]:
    """`_graph(package)` with each subpackage of `package` drawn as one node (``tuner.study``): its modules'
    imports are the package's."""
    def node(module: str) -> str:
        sub = ".".join(module.split(".")[:2])
        return sub if sub != module and _is_package(sub) else module

    out: dict[str, set[str]] = {}
    for module, targets in _graph(package).items():
        out.setdefault(node(module), set()).update(node(t) for t in targets)
    return {v: targets - {v} for v, targets in out.items()}


def test_no_import_circle_between_tuner_packages():
    """The packages of tuner/ are layers: study/ imports policy/, the backends import both and worker/, and
    nothing imports back up, not even through one module (a package drawn as one node has no circle)."""
    graph = _package_graph("tuner")
    assert _circles("tuner", graph) == []
    assert {"tuner.study", "tuner.policy", "tuner.worker", "tuner.backends"} <= set(graph)


def test_no_import_circle_between_lms_packages():
    """lms/ is one pipeline, top down: tf/ (applies) and sim/ (interprets) over the compile stage
    (`lms.pipeline`), over schedule/ and plan/, over the shared rules and models (`lms.rules`, `lms.order`,
    `lms.shapes`, `lms.graph`). The simulator and the scheduler imported each other until 2026-12-06."""
    graph = _package_graph("lms")
    assert _circles("lms", graph) == []
    assert "lms.sim" not in graph["lms.schedule"] and "lms.sim" not in graph["lms.pipeline"]


def test_tuner_root_holds_at_most_12_modules():
    """tuner/'s root keeps the process entry points, the search's top level and the few leaves every
    package shares; everything else lives in a package named for its role (study/, policy/, worker/...)."""
    flat = sorted(p.name for p in (ROOT / "tuner").glob("*.py"))
    assert len(flat) <= MAX_TUNER_ROOT_MODULES, f"{len(flat)} modules at tuner/'s root: {flat}"


def _unmapped(init: Path) -> list[str]:
    """The modules of `init`'s package that its docstring does not name (as ``name.py``)."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    modules = sorted(p.name for p in init.parent.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    return [name for name in modules if not re.search(rf"(?<![\w./]){re.escape(name)}\b", doc)]


#: Packages whose map is not written yet, each with why.
MAP_PENDING: dict[str, str] = {}


TUNER_PACKAGES = ["tuner", *sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "tuner").glob("*/__init__.py"))]


@pytest.mark.parametrize("package", TUNER_PACKAGES)
def test_each_tuner_package_docstring_is_its_map(package):
    """A package's ``__init__`` docstring names each of its modules (``run.py   what it owns``): the map a
    reader opens first."""
    if package in MAP_PENDING:
        pytest.skip(MAP_PENDING[package])
    assert _unmapped(ROOT / package / "__init__.py") == []


def test_the_checker_sees_a_circle(tmp_path, monkeypatch):
    """The checker itself: a deferred import closes a circle, and so does an import under
    TYPE_CHECKING; a module that only imports into a circle is not part of it; the failure names
    one walk around each circle."""
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from demo.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nfrom demo.b import f\nif TYPE_CHECKING:\n    from demo import d\n")
    (pkg / "d.py").write_text("from demo.c import f\n")
    (pkg / "e.py").write_text("from demo import a\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    mods = _modules("demo")
    monkeypatch.setitem(globals(), "ALL", mods)
    assert _circles("demo") == [["demo.a", "demo.b"], ["demo.c", "demo.d"]]
    assert describe_circles("demo") == [
        "demo.a -> demo.b -> demo.a  (imports inside: demo.a -> demo.b; demo.b -> demo.a)",
        "demo.c -> demo.d -> demo.c  (imports inside: demo.c -> demo.d; demo.d -> demo.c)"]


def test_the_suites_longest_first_order_names_files_that_exist() -> None:
    """tests/conftest.py's `FILE_SECONDS` orders the files for pytest-xdist: a renamed file would drop out of it."""
    from tests.conftest import FILE_SECONDS

    root = Path(__file__).resolve().parents[1]
    assert [name for name in FILE_SECONDS if not (root / name).is_file()] == []
