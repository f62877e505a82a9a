"""`switchyard` / `switchyard gui`: the desktop window on a qasync loop (one loop for Qt and asyncio)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from app.core.paths import Paths
from app.core.settings import Settings, load_settings


def make_qapp(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        QApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("Switchyard")
    app.setOrganizationName("Switchyard")
    app.setQuitOnLastWindowClosed(False)  # closing the window keeps the tray and the server
    from app.ui import theme

    theme.apply(app)
    return app


async def gui_main(app: QApplication, paths: Paths, settings: Settings) -> int:
    from app.ui.desktop import Desktop

    async with Desktop(paths, settings, qapp=app) as desk:
        # Ctrl-C in a terminal, SIGTERM at logout and SIGHUP from a closed terminal quit cleanly (every lane
        # stopped). Python runs signal handlers only between bytecodes, so a timer wakes the interpreter
        # while Qt sits idle.
        from app.server.app import stop_signals

        for sig in stop_signals():
            signal.signal(sig, lambda *_: desk.quit())
        wake = QTimer()
        wake.timeout.connect(lambda: None)
        wake.start(500)
        await desk.run()
        wake.stop()
    return 0


def run_gui(paths: Paths, *, settings: Settings | None = None) -> int:
    import qasync

    from app.ui.single import forward_to_running

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_qapp()
    if forward_to_running(paths):
        print("Switchyard is already running: its window was brought forward", file=sys.stderr)
        return 0
    settings = settings or load_settings(paths.settings_file)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        with loop:
            return int(loop.run_until_complete(gui_main(app, paths, settings)))
    finally:
        finish_qapp(app)


def finish_qapp(app: QApplication) -> None:
    """Quit's last step, before the interpreter finalizes: no Python callback left on Qt's side (signal
    handlers, the theme), the loop unset, the QApplication deleted while Python can still run its slots."""
    from app.server.app import stop_signals
    from app.ui import theme

    for sig in stop_signals():
        signal.signal(sig, signal.SIG_DFL)
    asyncio.set_event_loop(None)
    theme.release(app)
    import shiboken6

    if shiboken6.isValid(app):
        # the tray's menu, and anything else left: only the parentless ones, since a dialog with a parent
        # is a top-level window too and goes with that parent (deleting it again would crash)
        for widget in app.topLevelWidgets():
            if shiboken6.isValid(widget) and widget.parentWidget() is None:
                shiboken6.delete(widget)
        shiboken6.delete(app)
