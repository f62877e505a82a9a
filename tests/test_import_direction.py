"""Every non-ui package imports with PySide6 and qasync made unimportable."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import app

REPO = Path(__file__).resolve().parent.parent


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
            for line in f.read_text().splitlines():
                if any(imported.startswith(banned) for imported in _imported(line.strip())):
                    bad.append(f"{f.relative_to(REPO)}: {line.strip()}")
    assert not bad, bad


def test_only_the_entry_point_imports_the_cli() -> None:
    """app/cli is the command line: app/__main__.py builds it; no other package leans on it (the window
    and the server call the Runtime, not a command)."""
    bad = []
    for f in (REPO / "app").rglob("*.py"):
        rel = f.relative_to(REPO)
        if rel.parts[1] == "cli" or rel == Path("app/__main__.py"):
            continue
        for line in f.read_text().splitlines():
            if any(m == "app.cli" or m.startswith("app.cli.") for m in _imported(line.strip())):
                bad.append(f"{rel}: {line.strip()}")
    assert not bad, bad
    assert not list((REPO / "app").glob("cli_*.py")), "command modules live in app/cli/"


def _imported(statement: str) -> list[str]:
    """The app modules an import line names: `from app import cli_x, y` names app.cli_x and app.y."""
    words = statement.replace(",", " ").split()
    if not statement.startswith(("import app.", "from app.", "from app import")) or len(words) < 2:
        return []
    if words[:3] == ["from", "app", "import"]:
        return [f"app.{w}" for w in words[3:] if w.isidentifier() and w != "as"]
    return [words[1]]


def test_the_import_rule_sees_each_form() -> None:
    """The rule above is only as good as its parser: each way of naming a module is seen."""
    assert _imported("from app import cli, runtime") == ["app.cli", "app.runtime"]
    assert _imported("from app.cli.library import cmd_ls") == ["app.cli.library"]
    assert _imported("import app.hardware.probe") == ["app.hardware.probe"]
    assert _imported("from application import x") == []
