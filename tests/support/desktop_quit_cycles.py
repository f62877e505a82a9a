"""Run by tests/ui/test_quit.py in a child under PYTHONDEVMODE and faulthandler: the desktop opened
and quit N times in one process, then the app's own last step (app.ui.main.finish_qapp) with a window and
its dialog still open; prints what was left.

python -m tests.support.desktop_quit_cycles N MODELS_DIR   (SWITCHYARD_HOME, QT_QPA_PLATFORM set by the test)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

EVENTS = 30_000  # per cycle


def leftovers(app: Any) -> list[str]:
    """Our widgets and top-level Qt objects still alive after a quit."""
    import shiboken6

    alive = [w for w in app.topLevelWidgets() if shiboken6.isValid(w)]
    # an emptied tray menu is tolerated (the Desktop now deletes its menu as it exits: none should be left)
    kept = [w for w in alive if type(w).__name__ == "QMenu" and not w.actions() and not w.isVisible()]
    return sorted({type(w).__name__ for w in alive if w not in kept})


async def cycle(app: Any, models: Path) -> dict[str, Any]:
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop
    from app.ui.pages.registry import TITLES

    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=1)
    async with Desktop(Paths.from_env(), settings, qapp=app) as desk:
        window = desk.window
        for name in TITLES:
            window.show_page(name)
            await asyncio.sleep(0.05)
        window.pages["Discover"].why("none")  # nothing open: no dialog, no error
        # a long session's worth of events through the bridge (a day of hardware samples is 86,400):
        # PySide6 6.12.0's Signal.emit lost a reference to True per event, which aborted the
        # interpreter once True's count (about 12,000 here) ran out
        before = sys.getrefcount(True)
        for _ in range(EVENTS):
            desk.bridge.emit_local("ui.session", busy=True)
        drift = sys.getrefcount(True) - before
        window.show_about()
        window.close()  # to the tray first, as people do
        await asyncio.sleep(0.2)
        desk.quit()
        await desk.run()
    await asyncio.sleep(0.1)  # a turn of the loop: the window's deferred deletion
    import shiboken6

    return {"window_deleted": not shiboken6.isValid(window), "left": leftovers(app), "true_drift": drift}


def main() -> int:
    import qasync

    from app.ui.main import finish_qapp, make_qapp

    n, models = int(sys.argv[1]), Path(sys.argv[2])
    app = make_qapp()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    results = []
    try:
        with loop:
            for _ in range(n):
                results.append(loop.run_until_complete(cycle(app, models)))
        # quit with a window still up and a dialog of its own open (a Why? window left open): the dialog
        # is a top-level widget too, and must go with its parent, not be deleted a second time
        from PySide6.QtWidgets import QDialog, QWidget

        host = QWidget()
        host.show()
        QDialog(host).show()
    finally:
        finish_qapp(app)
    print("RESULT " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
