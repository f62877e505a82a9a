"""Every module of app/ imports under the Windows CPython: nothing POSIX-only runs at import time.

(The parent watch once read signal.SIGKILL when it was imported, which Windows' signal module lacks: the
workers and `switchyard serve` failed to start there.) app/ui included: the Windows test Python carries
PySide6.
"""

from __future__ import annotations

import pytest

from tests.windows.wine import Result, WinePython

pytestmark = pytest.mark.timeout(400)  # the module's one python.exe run, on a loaded machine


@pytest.fixture(scope="module")
def imports(wine: WinePython) -> Result:
    return wine.run("imports.py", timeout=300)


def test_every_module_of_app_imports_under_windows(imports: Result) -> None:
    summary = [line for line in imports.lines if "imported" in line]
    assert imports.returncode == 0 and summary, imports.tail()
    failures = [line for line in imports.lines if "module" in line]
    assert not failures, "\n".join(f"{f['module']}: {f['error']} ({f['at']})" for f in failures)
    assert summary[0]["platform"] == "win32"
    assert int(summary[0]["imported"]) > 200  # the walk found the packages (not an empty path)


def test_the_desktop_modules_under_windows(imports: Result) -> None:
    """PySide6 is in the Windows test Python (scripts/wine/requirements.txt; its Qt6Core loads with the
    stand-in icuuc.dll that scripts/wine-setup.sh builds): app/ui imports as Windows code too."""
    summary = next(line for line in imports.lines if "imported" in line)
    assert summary["skipped"] == [], f"app/ui was not imported under Windows: {summary['skipped'][:5]}"
