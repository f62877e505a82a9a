"""Every import a benchmark or script makes of this project names a module that exists.

Benchmarks import the test helpers lazily, inside the function that writes their models, so a move of a
helper module passes every test and breaks only the benchmark, found the next time someone measures (it
happened: `from tests import tinymodels` survived the move to tests/support/). This reads every import,
function bodies included, and resolves the project's own ones against the tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

OWN = ("app", "tests", "bench")
FILES = sorted([*(REPO / "bench").glob("*.py"), *(REPO / "scripts").glob("*.py")])


def _module_exists(name: str) -> bool:
    parts = name.split(".")
    base = REPO.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _missing(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            targets = [(n, None) for n in names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, member in targets:
            if module.split(".")[0] not in OWN:
                continue
            if not _module_exists(module):
                missing.append(f"line {node.lineno}: {module}")
            elif member and not _module_exists(f"{module}.{member}"):
                # `from pkg import name`: a submodule, or a name the module defines
                source = REPO.joinpath(*module.split("."))
                file = (
                    source.with_suffix(".py")
                    if source.with_suffix(".py").is_file()
                    else source / "__init__.py"
                )
                tree = ast.parse(file.read_text(encoding="utf-8"))
                defined = (
                    {
                        t.id
                        for n in ast.walk(tree)
                        if isinstance(n, ast.Assign)
                        for t in n.targets
                        if isinstance(t, ast.Name)
                    }
                    | {
                        n.name
                        for n in ast.walk(tree)
                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    }
                    | {
                        (a.asname or a.name).split(".")[0]
                        for n in ast.walk(tree)
                        if isinstance(n, ast.Import | ast.ImportFrom)
                        for a in n.names
                    }
                    | {
                        n.target.id
                        for n in ast.walk(tree)
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    }
                )
                if member not in defined:
                    missing.append(f"line {node.lineno}: {module}.{member}")
    return missing


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_own_import_resolves(path: Path) -> None:
    assert _missing(path) == [], f"{path.relative_to(REPO)} imports what is not there"
