"""No import cycles anywhere in app/: the module graph read with `ast`, its cycles found with Tarjan's SCC.

Which imports are edges: every `import` / `from ... import` that runs when the module is first loaded or
that a type checker follows — module level, inside `if`/`try`/`with`/class bodies, and inside
`if TYPE_CHECKING:` blocks (a TYPE_CHECKING cycle is still a knot in the design, and mypy follows it).
Imports inside function bodies are not edges: they run on call, after every module has loaded, and are the
legitimate way to load something lazily (Qt only for the GUI, a heavy engine only when asked for).
A second test also counts function-body imports: lazy loading is no excuse for two of our own modules
needing each other, so that graph must be acyclic too.

`from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`; relative imports are
resolved against the importing module's package; package `__init__` modules are nodes like any other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

APP = REPO / "app"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def app_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(APP.rglob("*.py"))}


def _imports(body: list[ast.stmt], *, lazy: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run at load time (or under TYPE_CHECKING); function bodies only if `lazy`."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not lazy:
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _imports([n for n in inner if not isinstance(n, ast.expr)], lazy=lazy)


def _base(mod: str, *, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = mod if is_package else mod.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def edges(mod: str, path: Path, *, known: set[str], lazy: bool = False) -> set[str]:
    """The app modules `mod` imports eagerly (and inside its functions too, if `lazy`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in _imports(tree.body, lazy=lazy):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
            continue
        base = _base(mod, is_package=path.name == "__init__.py", node=node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != mod}


def import_graph(*, lazy: bool = False) -> dict[str, set[str]]:
    mods = app_modules()
    known = set(mods)
    return {m: edges(m, p, known=known, lazy=lazy) for m, p in mods.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); only components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def cycle_chain(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete loop inside a component, as `a -> b -> ... -> a` (shortest back to the start)."""
    members = set(comp)
    start = comp[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for m in frontier:
            for n in sorted(graph[m] & members):
                if n == start:
                    return [*paths[m], start]
                if n not in paths:
                    paths[n] = [*paths[m], n]
                    nxt.append(n)
        frontier = nxt
    return comp  # unreachable for a true SCC


def describe(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{len(comp)} modules {comp}: " + " -> ".join(cycle_chain(comp, graph))
        for comp in strongly_connected(graph)
    ]


def test_the_walker_sees_known_shapes() -> None:
    """The finder itself: a loop, a self-free chain, and TYPE_CHECKING vs function-body imports."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert cycle_chain(["a", "b", "c"], graph) == ["a", "b", "c", "a"]
    assert strongly_connected({"x": {"y"}, "y": set()}) == []
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from app.core import errors\n"
        "def f():\n    from app.core import paths\n"
        "class K:\n    from app.core.settings import Settings\n"
        "from . import events\n"
    )
    tree = ast.parse(src)
    names = {(n.module, n.level, tuple(a.name for a in n.names)) for n in _imports(tree.body)}
    assert ("app.core", 0, ("errors",)) in names
    assert ("app.core.settings", 0, ("Settings",)) in names
    assert (None, 1, ("events",)) in names
    assert not any("paths" in n[2] for n in names)
    assert any("paths" in n.names[0].name for n in _imports(tree.body, lazy=True))


def test_relative_and_package_imports_resolve(tmp_path: Path) -> None:
    """`from . import x` inside a package, and `from pkg import name` to the module or the package."""
    known = {"app.core", "app.core.errors", "app.core.paths", "app.ui", "app.ui.pages"}
    init = tmp_path / "__init__.py"
    init.write_text("from . import errors\nfrom app.ui.pages import Page\n", encoding="utf-8")
    assert edges("app.core", init, known=known) == {"app.core.errors", "app.ui.pages"}
    mod = tmp_path / "paths.py"
    mod.write_text("from .errors import X\nfrom .. import ui\nimport app.ui.pages\n", encoding="utf-8")
    assert edges("app.core.paths", mod, known=known) == {"app.core.errors", "app.ui", "app.ui.pages"}


def test_the_graph_covers_app() -> None:
    graph = import_graph()
    assert "app.ui.desktop" in graph and "app.runtime" in graph
    assert "app.core.errors" in graph["app.ui.asyncs"]


def test_no_import_cycles_in_app() -> None:
    cycles = describe(import_graph())
    hint = "import cycles in app/ (break them by moving the shared piece to a module of its own):\n"
    assert not cycles, hint + "\n".join(cycles)


def test_no_lazy_import_cycles_in_app() -> None:
    """Counting function-body imports too: a lazy import between two of our own modules that need each
    other hides a cycle from the loader without removing it (lazy is for Qt and heavy engines, not for us)."""
    cycles = describe(import_graph(lazy=True))
    assert not cycles, "import cycles through function-body imports in app/:\n" + "\n".join(cycles)
