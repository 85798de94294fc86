"""The shape of the code: no import cycles and no oversized hand-written modules.

The modules are read with ``ast``; nothing is imported. Every ``import`` and
``from ... import`` statement counts, wherever it stands (an import inside a
function is still a dependency), except those under ``if TYPE_CHECKING:``,
which never run. ``from package import name`` depends on the submodule
``package.name`` when there is one, otherwise on the package itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eas_sdk", "gateway")
# Generated protobuf code: part of the import graph, not held to the size limit.
GENERATED = ("eas_sdk/_proto/", "gateway/_proto/")
MAX_LINES = 500

Graph = Mapping[str, Iterable[str]]


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, skipping the body of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes_of(other)
        else:
            yield from _import_nodes(child)


def _import_nodes_of(stmt: ast.stmt) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        yield stmt
    else:
        yield from _import_nodes(stmt)


def _known_prefix(name: str, modules: Iterable[str]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``a.b.c`` -> ``a.b``)."""
    known = set(modules)
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def dependencies(module: str, source: str, modules: Iterable[str], is_package: bool = False) -> set[str]:
    """The modules among ``modules`` that ``module`` (whose text is ``source``) imports."""
    known = set(modules)
    package = module if is_package else module.rpartition(".")[0]
    deps: set[str] = set()
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts)
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            targets = []
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                # A submodule imported by name is the dependency, not the package's __init__.
                targets.append(sub if sub in known else origin)
        for target in targets:
            resolved = _known_prefix(target, known)
            if resolved is not None and resolved != module:
                deps.add(resolved)
    return deps


def import_graph() -> dict[str, set[str]]:
    files = _module_files()
    return {
        name: dependencies(name, path.read_text(encoding="utf-8"), files, path.name == "__init__.py")
        for name, path in files.items()
    }


def find_components(graph: Graph) -> list[list[str]]:
    """The strongly connected components that hold a cycle, each sorted, found with
    Tarjan's algorithm (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
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
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return sorted(components)


def find_cycles(graph: Graph) -> list[list[str]]:
    """Cycles (first module repeated at the end): for every module on a cycle, the shortest
    cycle through it, each cycle reported once."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for component in find_components(graph):
        for member in component:
            cycle = _cycle_in(member, component, graph)
            body = cycle[:-1]
            first = body.index(min(body))
            key = tuple(body[first:] + body[:first])  # the same cycle, whatever module it starts at
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def _cycle_in(start: str, component: list[str], graph: Graph) -> list[str]:
    """A shortest cycle through ``start``, staying inside its component."""
    members = set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # unreachable for an SCC


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def test_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


def test_dependencies_follow_the_rules() -> None:
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "p.sub.x"}
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
from .. import a
from .x import thing
import p.c as c
if TYPE_CHECKING:
    from p import b
else:
    import p.d

def later():
    from ..b import other
"""
    # TYPE_CHECKING's body is skipped, its else branch and the import in a function are not.
    assert dependencies("p.sub.y", source, modules) == {"p.a", "p.sub.x", "p.c", "p.d", "p.b"}
    assert dependencies("p.sub.y", "if TYPE_CHECKING:\n    import p.a\n", modules) == set()
    # In a package's __init__, "." is the package itself.
    assert dependencies("p.sub", "from . import x\n", modules, is_package=True) == {"p.sub.x"}
    # "from p import name" where name is no submodule: a dependency on the package.
    assert dependencies("p.a", "from p import helper\n", modules) == {"p"}


def _sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in _module_files().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(GENERATED):
            continue
        with path.open(encoding="utf-8") as fh:
            sizes[rel] = sum(1 for _ in fh)
    return sizes


def test_no_oversized_modules() -> None:
    sizes = _sizes()
    over = sorted(rel for rel, n in sizes.items() if n > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(f"{m} ({sizes[m]})" for m in over)
