"""The frozen program's entry point (build.spec).

Worker processes (`switchyard _module app.lanes.workers.llamacpp ...`, see app/core/frozen.py) are
answered first, before the command line's heavy imports, so a lane starts as quickly from the bundle
as from `python -m`.

`SWITCHYARD_SCREENSHOT=FILE.png switchyard gui` saves the main window to FILE.png once it has been up
for `SWITCHYARD_SCREENSHOT_DELAY` seconds (default 3), then quits the way Ctrl+Q does. It works with
`QT_QPA_PLATFORM=offscreen`, which is how the packaging smoke test and the docs' screenshots see the
window of a bundle on a machine with no display.
"""

from __future__ import annotations

import os
import sys


def _arm_screenshot(target: str, delay_s: float) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QKeySequence, QShortcut
    from PySide6.QtWidgets import QMainWindow

    from app.ui.main import make_qapp

    qapp = make_qapp()  # run_gui finds and reuses this instance

    def shoot() -> None:
        windows = [w for w in qapp.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()]
        if not windows:
            QTimer.singleShot(500, shoot)  # the window is not up yet: the first catalog scan is slow
            return
        win = windows[0]
        ok = win.grab().save(target, "PNG")
        print(f"screenshot {'saved to' if ok else 'could not be written to'} {target}", file=sys.stderr)
        for sc in win.findChildren(QShortcut):
            if sc.key() == QKeySequence("Ctrl+Q"):
                sc.activated.emit()
                return
        qapp.quit()

    QTimer.singleShot(int(delay_s * 1000), shoot)


def _main() -> int:
    from app.core.frozen import MODULE_COMMAND, run_module

    if len(sys.argv) > 1 and sys.argv[1] == MODULE_COMMAND:
        return run_module(sys.argv[2:])
    shot = os.environ.get("SWITCHYARD_SCREENSHOT")
    if shot and sys.argv[1:] in ([], ["gui"]):
        _arm_screenshot(shot, float(os.environ.get("SWITCHYARD_SCREENSHOT_DELAY", "3")))
    from app.__main__ import main

    return main()


if __name__ == "__main__":
    raise SystemExit(_main())
