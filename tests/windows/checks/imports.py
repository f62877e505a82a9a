"""Run under the Windows CPython (tests/windows/test_wine_imports.py): import every module of app/.

Prints one JSON line per module that failed ({"module", "error"}) and a last line {"imported": N}.
app/ui needs PySide6 (installed in the Windows test Python by scripts/wine-setup.sh): its modules are
reported as skipped when it is missing, and tests/windows/test_wine_imports.py fails on that.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import traceback

import app


def main() -> int:
    has_qt = importlib.util.find_spec("PySide6") is not None
    imported, failed, skipped = 0, 0, []
    for info in pkgutil.walk_packages(app.__path__, prefix="app."):
        name = info.name
        if (name == "app.ui" or name.startswith("app.ui.")) and not has_qt:
            skipped.append(name)
            continue
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit or a native abort would end the loop: report and go on
            failed += 1
            last = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{last.filename}:{last.lineno}"
            print(
                json.dumps({"module": name, "error": f"{type(exc).__name__}: {exc}", "at": where}), flush=True
            )
        else:
            imported += 1
    print(json.dumps({"imported": imported, "failed": failed, "skipped": skipped, "platform": sys.platform}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
