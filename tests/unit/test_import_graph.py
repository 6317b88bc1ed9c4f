"""The import graphs of the shipped package (`controller`) and of the evaluation (`evaluation`)
have no cycles.

Every module-level import between modules of those packages is an edge (those under `if
TYPE_CHECKING:` too: a cycle through type hints is still a cycle a reader has to untangle);
imports inside functions are not (they run later, and are kept for optional dependencies such
as the kubernetes client). A cycle fails the test with its modules listed.

    python -m pytest tests/unit/test_import_graph.py      # the check
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "evaluation")


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for f in sorted(p for package in packages for p in (ROOT / package).rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        body = node.body if isinstance(node, ast.If) else [node]  # `if TYPE_CHECKING:`
        for stmt in body:
            if isinstance(stmt, ast.Import):
                yield from (a.name for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = here[: len(here) - stmt.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                yield base
                yield from (f"{base}.{a.name}" for a in stmt.names)


def graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the package it imports at module level."""
    return {name: {m for m in _imports(name, path) if m in mods and m != name}
            for name, path in mods.items()}


def cycles(g: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_the_package() -> None:
    g = graph(modules())
    assert len(g) > 40
    assert "controller.workload" in g["controller.live.diff"]  # `from controller.workload import`
    assert "controller.domain" in g["controller.workload"]
    assert "evaluation.kueue" in g["evaluation.policies"]


def test_no_import_cycles() -> None:
    assert cycles(graph(modules())) == []


def test_the_shipped_package_imports_nothing_of_the_evaluation() -> None:
    g = graph(modules())
    assert not [(m, d) for m, deps in g.items() if m.startswith("controller")
                for d in deps if d.startswith("evaluation")]


def test_every_module_imports() -> None:
    """Each module imports on its own (an import cycle that only bites in some orders shows up
    here as an ImportError)."""
    for name in modules():
        importlib.import_module(name)
