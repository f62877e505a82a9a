"""Every non-ui package imports with PySide6 and qasync made unimportable."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import app

REPO = Path(__file__).resolve().parents[2]


def test_headless_packages_import_without_qt() -> None:
    names = [m.name for m in pkgutil.walk_packages(app.__path__, "app.") if not m.name.startswith("app.ui")]
    assert "app.server.app" in names and "app.lanes.supervisor" in names
    code = (
        "import sys\n"
        "for blocked in ('PySide6', 'qasync', 'shiboken6'): sys.modules[blocked] = None\n"
        f"import importlib\nfor n in {names!r}: importlib.import_module(n)\n"
        "assert not any(k.startswith('PySide6') and sys.modules[k] for k in sys.modules)\n"
        "print('ok', len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_layers_import_one_way() -> None:
    """core imports nothing of ours above it; formats/hardware/library never import lanes or server; advice
    never imports the CLI; the GUI asks the Runtime for hardware instead of probing it."""
    above_lanes = ("app.server", "app.runtime", "app.ui", "app.advice")
    forbidden = {
        "core": (
            "app.formats",
            "app.hardware",
            "app.library",
            "app.lanes",
            "app.server",
            "app.runtime",
            "app.ui",
            "app.advice",
        ),
        "formats": ("app.library", "app.lanes", *above_lanes),
        "hardware": ("app.library", "app.lanes", *above_lanes),
        "library": ("app.lanes", *above_lanes),
        "hub": ("app.fit", "app.routing", "app.library", "app.lanes", *above_lanes),
        "fit": ("app.library", "app.lanes", "app.routing", *above_lanes),
        "routing": ("app.library", "app.lanes", *above_lanes),
        "lanes": above_lanes,
        "advice": ("app.cli", "app.__main__", "app.server", "app.runtime", "app.ui"),
        "server": ("app.ui",),
        "ui": ("app.hardware",),
    }
    bad = []
    for pkg, banned in forbidden.items():
        for f in (REPO / "app" / pkg).rglob("*.py"):
            for line, imported in _imports_in(f):
                if imported.startswith(banned) and (pkg, imported) not in BELOW_ITS_FOLDER:
                    bad.append(f"{f.relative_to(REPO)}:{line}: {imported}")
    assert not bad, bad


# The one module above routing that routing reads: the lanes table (ids, titles, routes), kept with the
# engine kinds so a new kind touches no routing file. It stays as low as routing itself (next test).
BELOW_ITS_FOLDER = {("routing", "app.lanes.engines.facts")}


def test_what_routing_reads_of_the_lanes_imports_nothing_of_ours() -> None:
    """app/lanes/engines/facts.py is plain data: importing it must load no engine code, nothing of lanes
    and nothing above routing (only app.core, app.formats and app.hardware, if anything)."""
    for _, module in BELOW_ITS_FOLDER:
        f = REPO / (module.replace(".", "/") + ".py")
        bad = [m for _, m in _imports_in(f) if not m.startswith(("app.core", "app.formats", "app.hardware"))]
        assert not bad, f"{f.relative_to(REPO)} imports {bad}: routing reads it, so it must stay low"
    for init in ("app/lanes/__init__.py", "app/lanes/engines/__init__.py"):
        assert _imports_in(REPO / init) == [], f"{init} imports code, which routing would load"


def test_core_imports_nothing_outside_core() -> None:
    """core is the floor: settings, paths, events, errors and the policy parser need nothing of ours but
    core itself, so every other package can lean on it without a cycle."""
    bad = [
        f"{f.relative_to(REPO)}:{line}: {imported}"
        for f in (REPO / "app" / "core").rglob("*.py")
        for line, imported in _imports_in(f)
        if imported != "app.core" and not imported.startswith("app.core.")
    ]
    assert not bad, f"app/core imports outside app.core (move the code into core or the import up): {bad}"


def test_only_the_entry_point_imports_the_cli() -> None:
    """app/cli is the command line: app/__main__.py builds it; no other package leans on it (the window
    and the server call the Runtime, not a command)."""
    bad = []
    for f in (REPO / "app").rglob("*.py"):
        rel = f.relative_to(REPO)
        if rel.parts[1] == "cli" or rel == Path("app/__main__.py"):
            continue
        for line, imported in _imports_in(f):
            if imported == "app.cli" or imported.startswith("app.cli."):
                bad.append(f"{rel}:{line}: {imported}")
    assert not bad, bad
    assert not list((REPO / "app").glob("cli_*.py")), "command modules live in app/cli/"


def _imports_in(f: Path) -> list[tuple[int, str]]:
    """(line, module) for each app module the file imports; relative imports resolved against its package."""
    return _imports(f.read_text(), package=".".join(f.relative_to(REPO).parts[:-1]))


def _imports(source: str, package: str = "app") -> list[tuple[int, str]]:
    """Every import of an app module anywhere in `source` (module level, inside functions, under
    TYPE_CHECKING, over several lines), read with ast: `from app import cli, x` names app.cli and app.x;
    `from .x import y` in package app.lanes names app.lanes.x."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base == "app" or not node.module:  # `from app import x` / `from . import x`: x is a module
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, base))
    return [(line, m) for line, m in found if m == "app" or m.startswith("app.")]


def _imported(source: str, package: str = "app") -> list[str]:
    return [m for _, m in _imports(source, package)]


def test_the_import_rule_sees_each_form() -> None:
    """The rules above are only as good as their parser: each way of naming a module is seen."""
    assert _imported("from app import cli, runtime") == ["app.cli", "app.runtime"]
    assert _imported("from app.cli.library import cmd_ls") == ["app.cli.library"]
    assert _imported("import app.hardware.probe") == ["app.hardware.probe"]
    assert _imported("from application import x") == []
    assert _imported("import application.x, app.ui as u") == ["app.ui"]
    assert _imported("from app import (\n    cli,\n    runtime as rt,\n)\n") == ["app.cli", "app.runtime"]
    nested = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.server import x\n"
    assert _imported(nested + "def f():\n    import app.ui.main\n") == ["app.server", "app.ui.main"]
    # a package: the parser names what the line imports
    assert _imported("from . import remote", package="app.lanes") == ["app.lanes.remote"]
    assert _imported("from ..server.app import make_app", package="app.lanes") == ["app.server.app"]
    assert _imports("x = 1\n\nfrom app.hub import (\n    client,\n)\n") == [(3, "app.hub")]
    assert any(
        m.startswith("app.hub.") for _, m in _imports_in(REPO / "app" / "lanes" / "remote" / "lane.py")
    )
