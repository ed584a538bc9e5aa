"""pecode's modules import one another without a circle.

The import graph is read from the source with ``ast``, not by importing: one node per
module of the package (a package is its ``__init__.py``), one edge per module an import
statement names. ``import pecode.x.y`` names ``pecode.x.y``; ``from pecode.x import y``
names the submodule ``pecode.x.y`` when there is one, else ``pecode.x``; relative imports
(``from . import y``, ``from ..x import y``) are resolved against the importing module.

What counts, decided here:

* imports inside functions count as much as those at module level: a lazy import only
  delays a circle to the first call, and it is how the last one was closed
  (``pecode.bench`` -> ``pecode.experiments`` -> ``pecode.relative`` -> ``pecode.bench``,
  through a module-level ``__getattr__`` in ``pecode.relative`` that imported
  ``pecode.bench`` on first use); imports under ``if TYPE_CHECKING:`` count too, so that
  no circle hides there either;
* importing ``pecode.x.y`` also runs ``pecode/x/__init__.py`` first, but that implicit
  edge from a submodule to its parent package is not drawn: a package that re-exports its
  submodules (``pecode.bench``, ``pecode.relative``) would otherwise be a circle by
  construction. A submodule that imports its own package explicitly
  (``from pecode.x import name`` inside ``pecode.x.y``) does get the edge, and closes a
  circle if the package imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_of(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, whether it is a package's ``__init__``) for every module."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _base(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in its source."""
    modules = modules_of(package)
    graph = {}
    for name, (path, is_package) in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _base(node, name, is_package)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    named.add(submodule if submodule in modules else base)
        graph[name] = {target for target in named if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None; depth first, in sorted order."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_pecode_has_no_import_cycle():
    graph = import_graph(ROOT / "pecode")
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_holds_the_edges_the_bench_split_relies_on():
    graph = import_graph(ROOT / "pecode")
    # the graph is not empty by mistake: known imports, at module level and relative to
    # the package, are edges
    assert {"pecode.bench.harness", "pecode.bench.rope_cases"} <= graph["pecode.bench"]
    assert "pecode.utils" in graph["pecode.bench.harness"]
    assert "pecode.bench.harness" in graph["pecode.bench.rope_cases"]
    assert "pecode.utils" in graph["pecode.experiments.models"]
    # the bench no longer reaches the experiments, and the math never reaches the bench
    assert not _reaches(graph, "pecode.bench", "pecode.experiments")
    assert not _reaches(graph, "pecode.relative", "pecode.bench")


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal or node.startswith(f"{goal}."):
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


@pytest.mark.parametrize(
    ("graph", "want"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"a"}}, ["a", "a"]),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, None),  # a diamond
    ],
    ids=["circle", "self", "diamond"],
)
def test_the_cycle_finder_names_a_cycle_and_only_a_cycle(graph, want):
    assert find_cycle(graph) == want


def test_false_neighbour_a_circle_closed_inside_a_function_is_found(tmp_path):
    # pkg.a imports pkg.b at module level; pkg.b imports pkg.a back, relatively and only
    # inside a function, as pecode.relative's __getattr__ once imported pecode.bench
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("from pkg.b import helper\n")
    (package / "b.py").write_text("def helper():\n    from . import a\n    return a\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from ..b import helper\nimport pkg.sub\n")
    graph = import_graph(package)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.b", "pkg.sub"},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    # without the import inside the function, no cycle
    (package / "b.py").write_text("def helper():\n    return 1\n")
    assert find_cycle(import_graph(package)) is None
