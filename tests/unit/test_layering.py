"""The layers, checked on the source (docs/design.md §2): ``schemas`` <- ``projections`` <- ``engine``.

* ``schemas`` imports nothing of ours outside ``schemas``; ``projections`` never imports ``engine``.
  Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:`` (a type
  that names an upper layer is a dependency on it all the same).
* No import cycles between our modules, counting imports inside functions (they run, only later)
  and, in a second test, those under ``if TYPE_CHECKING:`` too: those never run, so they cannot
  make a module see another half-initialised, but a type named across a circle still ties the two
  modules together (the module map draws it; ``schemas.commit`` exists to break one).
  Importing ``a.b.c`` is an edge to the module ``a.b.c`` only, not to the packages ``a`` and
  ``a.b`` that Python initialises on the way (else every package ``__init__`` that re-exports a
  submodule would be a cycle).

Imports are read with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "projections", "engine")
FORBIDDEN = {"schemas": {"projections", "engine"}, "projections": {"engine"}, "engine": set()}

KNOWN_CYCLES: list[frozenset[str]] = []
"""Cycles that exist today and are being removed; every other cycle fails the test."""


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of ours
    line: int
    type_checking: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, guarded: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement below ``node`` (functions and classes included), and whether it
    sits in the body of an ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, guarded
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), guarded)
        else:
            yield from _walk(child, guarded)


def _ours(name: str) -> str | None:
    """The module of ours that importing ``name`` loads (the longest known prefix), if any."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, source: str | None = None) -> list[Import]:
    path = MODULES[module]
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    for node, guarded in _walk(tree, False):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b`` loads the module a.b when b is one, else (only) a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            ours = _ours(target)
            if ours is not None and ours != module:
                found.append(Import(module, ours, node.lineno, guarded))
    return found


ALL_IMPORTS: list[Import] = [i for m in MODULES for i in imports_of(m)]


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def runtime_graph(imports: Iterable[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in imports:
        if not i.type_checking:
            graph[i.source].add(i.target)
    return graph


# -- the parser sees what is there (so the checks below can fail) --------------------------------
def test_the_parser_finds_module_function_and_type_checking_imports() -> None:
    facade = {(i.target, i.type_checking) for i in imports_of("engine.facade")}
    assert ("projections.runtime", False) in facade  # module level
    assert ("schemas.batch", True) in {(i.target, i.type_checking) for i in imports_of("schemas.event_types")}
    state = {i.target for i in imports_of("engine.state")}
    assert "engine.log.kafka" in state  # imported inside open_kafka_parts
    probe = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
             "from . import batch\nfrom .ids import ConversationID\nif TYPE_CHECKING:\n    import engine.facade\n"
             "def f() -> None:\n    from projections import keys\n")
    got = {(i.target, i.type_checking) for i in imports_of("schemas.errors", probe)}
    assert got == {("schemas.batch", False), ("schemas.ids", False), ("engine.facade", True),
                   ("projections.keys", False)}


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert sorted(map(sorted, strongly_connected(graph))) == [["a", "b", "c"], ["e", "f"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


# -- the rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", PACKAGES)
def test_a_layer_never_imports_a_layer_above_it(layer: str) -> None:
    wrong = [f"{MODULES[i.source].relative_to(ROOT)}:{i.line} imports {i.target}"
             + (" (under TYPE_CHECKING)" if i.type_checking else "")
             for i in ALL_IMPORTS
             if i.source.split(".")[0] == layer and i.target.split(".")[0] in FORBIDDEN[layer]]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_one_that_imports_it_back() -> None:
    cycles = strongly_connected(runtime_graph(ALL_IMPORTS))
    unknown = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not unknown, f"import cycles: {unknown}"


def test_no_cycle_even_through_type_checking_imports() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in ALL_IMPORTS:
        graph[i.source].add(i.target)
    cycles = [sorted(c) for c in strongly_connected(graph)]
    assert not cycles, f"import cycles through annotations: {cycles}"
