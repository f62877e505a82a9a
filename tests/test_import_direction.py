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
    """core imports nothing of ours above it; formats/hardware/library never import lanes or server."""
    forbidden = {
        "core": (
            "app.formats",
            "app.hardware",
            "app.library",
            "app.lanes",
            "app.server",
            "app.runtime",
            "app.ui",
        ),
        "formats": ("app.library", "app.lanes", "app.server", "app.runtime", "app.ui"),
        "hardware": ("app.library", "app.lanes", "app.server", "app.runtime", "app.ui"),
        "library": ("app.lanes", "app.server", "app.runtime", "app.ui"),
        "hub": (
            "app.fit",
            "app.routing",
            "app.library",
            "app.lanes",
            "app.server",
            "app.runtime",
            "app.ui",
            "app.explain",
        ),
        "fit": (
            "app.library",
            "app.lanes",
            "app.routing",
            "app.server",
            "app.runtime",
            "app.ui",
            "app.explain",
        ),
        "routing": ("app.library", "app.lanes", "app.server", "app.runtime", "app.ui", "app.explain"),
        "lanes": ("app.server", "app.runtime", "app.ui", "app.explain", "app.doctor"),
        "server": ("app.ui",),
    }
    bad = []
    for pkg, banned in forbidden.items():
        for f in (REPO / "app" / pkg).rglob("*.py"):
            for line in f.read_text().splitlines():
                s = line.strip()
                if s.startswith(("import app.", "from app.")) and s.split()[1].startswith(banned):
                    bad.append(f"{f.relative_to(REPO)}: {s}")
    assert not bad, bad
