"""Run by tests/ui/test_screenshots.py under Xvfb with a tray host: every page with real data, saved as PNG.

python -m tests.support.ui_screens OUT_DIR MODELS_DIR REPO  (HF_ENDPOINT, SWITCHYARD_HOME, DISPLAY set by the
test)

The pictures are the test's evidence, named `x11-PAGE.png` (and `screen.png`, the whole screen with the
tray), and go to a scratch folder: the docs' screenshots come from tests/support/ui_pictures.py, so OUT_DIR
may
not be inside docs/ (an old run there would bring back pictures the docs no longer use).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def _run(out: Path, models: Path, repo: str) -> dict[str, Any]:
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop

    app = QApplication.instance()
    paths = Paths.from_env()
    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)
    result: dict[str, Any] = {}

    async def pause(s: float = 0.3) -> None:
        await asyncio.sleep(s)

    async with Desktop(paths, settings, qapp=app) as desk:  # type: ignore[arg-type]
        w = desk.window
        w.resize(1200, 760)
        w.move(40, 60)
        await pause(1)
        result["tray_available"] = QSystemTrayIcon.isSystemTrayAvailable()
        result["tray_visible"] = desk.tray.isVisible()

        def shot(name: str, widget: Any = None) -> None:
            (widget or w).grab().save(str(out / name))

        disc = w.show_page("Discover")
        disc.query.setText("tiny")
        disc.search()
        await desk.tasks.settle()
        row = next(i for i, h in enumerate(disc.hits) if h["id"] == repo)
        disc.results.selectRow(row)
        await desk.tasks.settle()
        done = [False]
        desk.bridge.received.connect(lambda k, _d: done.__setitem__(0, done[0] or k == "download.completed"))
        disc.download("Q8_0")
        await desk.tasks.settle()
        while not done[0]:
            await pause(0.1)
        await pause()
        shot("x11-discover.png")
        dlg = disc.why("Q4_K_M")
        assert dlg is not None
        dlg.resize(680, 640)
        await pause()
        shot("x11-why.png", dlg)
        dlg.close()

        lib = w.show_page("Library")
        await desk.tasks.settle()
        lib.load("tiny-assistant")
        await desk.tasks.settle(limit=90)
        await pause()
        lib.select("tiny-assistant")
        await desk.tasks.settle()  # the fit of the selected model's settings
        await pause()
        shot("x11-library.png")

        chat = w.show_page("Chat")
        chat.new_conversation(model="tiny-assistant")
        chat.system.setText("You are a helpful assistant.")
        chat.max_tokens.setValue(24)
        task = chat.send("Say hello in three languages.")
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await pause()
        shot("x11-chat.png")

        srv = w.show_page("Server")
        key = srv.create_key("editor")
        async with aiohttp.ClientSession() as s:
            for path in ("/v1/models", "/api/lanes", "/health"):
                await s.get(f"{desk.server.url}{path}", headers={"Authorization": f"Bearer {key}"})
        await pause()
        shot("x11-server.png")
        srv.tabs.setCurrentIndex(1)
        await pause()
        shot("x11-server-keys.png")
        srv.tabs.setCurrentIndex(2)
        await pause()
        shot("x11-server-log.png")

        lanes = w.show_page("Lanes")
        lanes.table.selectRow(0)
        await pause(1.2)
        shot("x11-lanes.png")
        w.show_page("Hardware")
        await pause(4)
        shot("x11-hardware.png")
        w.show_page("Settings")
        await pause()
        shot("x11-settings.png")
        desk.theme.set("dark")
        w.show_page("Library")
        await pause()
        shot("x11-library-dark.png")
        desk.theme.set("system")
        # the whole screen: the tray host (trayer) with our icon at the top right
        grab = ["import", "-window", "root", str(out / "screen.png")]
        await asyncio.to_thread(subprocess.run, grab, check=True, timeout=20)
        desk.quit()
        await desk.run()
    return result


def main() -> int:
    import qasync

    from app.ui.main import finish_qapp, make_qapp

    out, models, repo = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if DOCS in (out.resolve(), *out.resolve().parents):
        print(
            f"{out} is inside docs/: these pictures go to a scratch folder; the docs' screenshots are made "
            "by `python -m tests.support.ui_pictures docs/screenshots`",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    app = make_qapp()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        with loop:
            result = loop.run_until_complete(_run(out, models, repo))
    finally:
        finish_qapp(app)  # the app's own last step: nothing of Qt's left for the interpreter's finalization
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
