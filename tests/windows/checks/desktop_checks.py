"""Run under the Windows CPython (tests/windows/test_wine_desktop.py): the desktop as Windows code.

Qt's offscreen platform under wine (its native Windows window aborts in wine 8.0: docs/install.md): the
real Desktop with every page, its single-instance socket (a named pipe on Windows), start at login (the
Run key in the registry), images dropped or pasted from paths with spaces, and the tray's fallback.
Usage: desktop_checks.py OUT_DIR [CHECK...]; screenshots go to OUT_DIR. One JSON line per check, as in
platform_checks.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.windows.checks.runner import Checks

# wine drops QT_* from the environment it passes on: set here. The offscreen platform reads fonts from one
# folder (a real Windows window asks the system instead); the test passes the host's, as SY_QT_FONTDIR.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ.get("SY_QT_FONTDIR"):
    os.environ.setdefault("QT_QPA_FONTDIR", os.environ["SY_QT_FONTDIR"])

CHECKS = Checks()
check = CHECKS.add
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())


def _qapp() -> Any:
    from app.ui.main import make_qapp

    return make_qapp(["switchyard"])


def _drawn(image: Any) -> int:
    """How many distinct colours a grab has, sampled on a grid: a blank or unpainted page has one or two."""
    colours = set()
    for x in range(0, image.width(), max(1, image.width() // 40)):
        for y in range(0, image.height(), max(1, image.height() // 40)):
            colours.add(image.pixel(x, y))
    return len(colours)


@check
def every_page_renders(tmp: Path) -> object:
    """The real Desktop (Runtime, server control, bridge, tray, chat store) with each page shown at 1024x640,
    in the light and the dark theme, grabbed to a PNG."""
    import qasync

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop
    from app.ui.pages.registry import TITLES

    qapp = _qapp()
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    models = tmp / "models with spaces"
    models.mkdir()
    home = tmp / "home with spaces"
    settings = Settings.flat(port=0, models_dirs=(models,), start_server_with_app=False, monitor_interval_s=0)
    drawn: dict[str, int] = {}

    async def walk() -> None:
        async with Desktop(Paths(home=home), settings, qapp=qapp) as desk:
            desk.window.resize(1024, 640)
            for theme in ("light", "dark"):
                desk.theme.set(theme)
                for title in TITLES:
                    desk.window.show_page(title)
                    await asyncio.sleep(0.3)  # the loop is Qt's: it lays out and paints meanwhile
                    image = desk.window.grab().toImage()
                    name = f"{title.lower()}-{theme}.png"
                    if not image.save(str(OUT / name)):
                        raise AssertionError(f"could not write {OUT / name}")
                    drawn[name] = _drawn(image)
                    if image.width() != 1024:
                        raise AssertionError(f"{name}: the window is {image.width()} px wide, not 1024")
            await desk.tasks.settle()

    try:
        loop.run_until_complete(asyncio.wait_for(walk(), 240))
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    flat = [name for name, n in drawn.items() if n < 4]
    if flat:
        raise AssertionError(f"pages drawn blank: {flat}")
    return drawn


@check
def single_instance_brings_the_first_forward(tmp: Path) -> object:
    """A second launch (another python.exe, as a double-click would start) finds the first window through
    its local socket (a named pipe on Windows) and asks it forward; another home's launch does not."""
    import subprocess

    from app.core.paths import Paths
    from app.ui.single import InstanceServer

    qapp = _qapp()
    shown: list[float] = []
    paths = Paths(home=tmp / "home")
    server = InstanceServer(paths, lambda: shown.append(time.monotonic()))
    second = (
        "import sys; from PySide6.QtCore import QCoreApplication; from app.core.paths import Paths; "
        "from app.ui.single import forward_to_running; app = QCoreApplication([]); "
        "sys.exit(0 if forward_to_running(Paths(home=sys.argv[1]), timeout_ms=5000) else 3)"
    )

    def launch(home: Path) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", second, str(home)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            qapp.processEvents()  # the first window keeps its loop turning while the second knocks
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        _out, err = proc.communicate()
        if proc.returncode not in (0, 3):
            raise AssertionError(
                f"the second launch failed ({proc.returncode}): {err.decode(errors='replace')[-800:]}"
            )
        return proc.returncode

    try:
        if not server.server.isListening():
            raise AssertionError(f"the instance server does not listen: {server.server.errorString()}")
        if launch(paths.home) != 0:
            raise AssertionError("a second launch did not reach the first")
        deadline = time.monotonic() + 5
        while not shown and time.monotonic() < deadline:
            qapp.processEvents()
            time.sleep(0.02)
        if not shown:
            raise AssertionError("the second launch connected, but the first window was never asked forward")
        if launch(tmp / "another home") != 3:
            raise AssertionError("a launch with another SWITCHYARD_HOME reached this window")
        return server.server.fullServerName()
    finally:
        server.close()


@check
def start_at_login_is_the_run_key(tmp: Path) -> object:
    """On, the Run key holds the command that starts the window; off, the value is gone."""
    import winreg

    from app.ui import autostart

    def value() -> str | None:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, autostart.RUN_KEY) as key:
            try:
                return str(winreg.QueryValueEx(key, "Switchyard")[0])
            except FileNotFoundError:
                return None

    before = autostart.enabled()
    try:
        autostart.set_enabled(True)
        line = value()
        if not autostart.enabled() or line is None:
            raise AssertionError(f"the Run key was not written (value {line!r})")
        if sys.executable not in line or "gui" not in line:
            raise AssertionError(f"the Run key does not start the window: {line!r}")
        autostart.set_enabled(False)
        if autostart.enabled() or value() is not None:
            raise AssertionError("the Run key stayed after start at login was turned off")
        return line
    finally:
        autostart.set_enabled(before)


@check
def dropped_and_pasted_images(tmp: Path) -> object:
    """A file dropped from a folder with spaces and non-ASCII letters, and a bitmap pasted without a file."""
    from PySide6.QtCore import QMimeData, QUrl
    from PySide6.QtGui import QColor, QImage

    from app.ui.chat_images import carries_images, images_in

    _qapp()
    folder = tmp / "Bilder mit Leerzeichen – ü"
    folder.mkdir()
    picture = QImage(32, 24, QImage.Format.Format_RGB32)
    picture.fill(QColor("#3366cc"))
    path = folder / "screen shot.png"
    if not picture.save(str(path)):
        raise AssertionError(f"could not write {path}")
    dropped = QMimeData()
    dropped.setUrls([QUrl.fromLocalFile(str(path))])
    got = images_in(dropped)
    if not carries_images(dropped) or [name for name, _ in got] != ["screen shot.png"]:
        raise AssertionError(f"the dropped file was not taken: {[n for n, _ in got]}")
    if got[0][1] != path.read_bytes():
        raise AssertionError("the dropped file's bytes changed")
    pasted = QMimeData()
    pasted.setImageData(picture)
    got = images_in(pasted)
    if [name for name, _ in got] != ["pasted image"] or not got[0][1].startswith(b"\x89PNG"):
        raise AssertionError(f"the pasted bitmap was not taken as a PNG: {[n for n, _ in got]}")
    return {"dropped": str(path), "pasted_bytes": len(got[0][1])}


@check
def tray_where_there_is_none(tmp: Path) -> object:
    """Qt's offscreen platform has no notification area, as some Windows shells hide it: the window must
    still build, and say so, not crash."""
    from PySide6.QtWidgets import QSystemTrayIcon

    _qapp()
    return {"tray_available": QSystemTrayIcon.isSystemTrayAvailable()}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    return CHECKS.run(prefix="sy win desktop ", wanted=set(sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
