"""Each page rendered with real data on a real X server (Xvfb) with a tray host (trayer), saved as PNG;
the tray icon must be available and shown. The pictures go to the test's own folder
(tests/support/ui_screens.py
refuses docs/); SWITCHYARD_SCREENSHOT_DIR=docs/screenshots copies the whole-screen one with the tray,
`screen.png`, which the docs show. The docs' page pictures come from tests/support/ui_pictures.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import link_models
from tests.support.fakehub import FakeHub
from tests.support.tinymodels import CHAT, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
HUB_REPO = "acme/Tiny-Assistant-1B-GGUF"
CARD = """---
license: apache-2.0
---
# Tiny Assistant 1B (GGUF)

A small chat model in GGUF format, quantized several ways. Pick the largest that fits.

| Quantization | Use |
|---|---|
| Q4_K_M | most machines |
| Q8_0 | best quality |

```python
from openai import OpenAI
```
"""


def _free_display() -> int:
    for n in range(91, 200):
        if not Path(f"/tmp/.X{n}-lock").exists() and not Path(f"/tmp/.X11-unix/X{n}").exists():
            return n
    raise RuntimeError("no free X display number")


@pytest.fixture
def xserver() -> Iterator[str]:
    missing = [t for t in ("Xvfb", "trayer", "import") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make debian-deps installs them)")
    pytest.importorskip("PySide6")
    n = _free_display()
    display = f":{n}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x860x24", "-nolisten", "tcp"])
    procs = [xvfb]
    try:
        deadline = time.monotonic() + 15
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            assert xvfb.poll() is None and time.monotonic() < deadline, "Xvfb did not start"
            time.sleep(0.05)
        env = dict(os.environ, DISPLAY=display)
        procs.append(
            subprocess.Popen(
                [
                    "trayer",
                    "--edge",
                    "top",
                    "--align",
                    "right",
                    "--widthtype",
                    "request",
                    "--height",
                    "28",
                    "--transparent",
                    "false",
                    "--tint",
                    "0x303030",
                    "--SetDockType",
                    "true",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(0.5)
        yield display
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def test_every_page_rendered_and_tray_icon_shown(
    xserver: str, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path, model_store: Path
) -> None:
    gguf = write_tiny_gguf(tmp_path / "src" / "tiny.gguf", CHAT)
    fake_hub.add_repo(
        HUB_REPO,
        {
            "README.md": CARD.encode(),
            "tiny-assistant-1b-Q4_K_M.gguf": gguf,
            "tiny-assistant-1b-Q8_0.gguf": gguf,
        },
        tags=["gguf", "text-generation"],
        downloads=48213,
        likes=312,
    )
    fake_hub.add_repo("acme/Tiny-Embed-GGUF", {"tiny-embed-Q8_0.gguf": gguf}, tags=["gguf"], downloads=920)
    models = tmp_path / "models"
    link_models(models, model_store / "tiny.gguf")
    (models / "tiny.gguf").rename(models / "tiny-assistant.gguf")
    out = tmp_path / "shots"
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
    env.update(DISPLAY=xserver, QT_QPA_PLATFORM="xcb")
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.ui_screens", str(out), str(models), HUB_REPO],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result == {"tray_available": True, "tray_visible": True}
    pages = (
        "x11-discover",
        "x11-why",
        "x11-library",
        "x11-chat",
        "x11-server",
        "x11-server-keys",
        "x11-server-log",
        "x11-lanes",
        "x11-hardware",
        "x11-settings",
        "x11-library-dark",
        "screen",
    )
    for name in pages:
        png = out / f"{name}.png"
        assert png.stat().st_size > 5000, name  # a real picture, not an empty grab
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.stem for p in out.glob("*.png")) == sorted(pages)
    if os.environ.get("SWITCHYARD_SCREENSHOT_DIR"):  # the docs use only the whole screen with the tray
        docs = Path(os.environ["SWITCHYARD_SCREENSHOT_DIR"])
        shutil.copyfile(out / "screen.png", (docs if docs.is_absolute() else REPO / docs) / "screen.png")


def test_the_x11_pictures_never_go_into_docs(tmp_path: Path) -> None:
    """An old-named picture cannot come back into docs/screenshots: the script refuses the folder before
    it draws anything, and says where the docs' pictures come from."""
    before = sorted(p.name for p in (REPO / "docs" / "screenshots").iterdir())
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.ui_screens", "docs/screenshots", str(tmp_path), HUB_REPO],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "tests.support.ui_pictures" in run.stderr, run.stderr
    assert sorted(p.name for p in (REPO / "docs" / "screenshots").iterdir()) == before
