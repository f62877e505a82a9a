"""The window as a new user meets it, at 1024x640 (issue 20), continued: every page fits, and a repository
with no file that fits suggests a smaller model. A file of its own: each Qt file runs in a process of its
own, and a process that builds many Desktops has died of SIGSEGV in Qt (tests/support/desks.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")


from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402
from tests.support.tinymodels import MEDIUM, write_tiny_gguf  # noqa: E402
from tests.ui.test_new_user_window import MIXED  # noqa: E402


def test_every_page_fits_1024_by_640(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    """The window can be as small as 1024x640 on every page: no page's height (Settings' long form was one)
    sets a larger minimum, and the window really takes that size."""
    from app.ui.desktop import Desktop
    from app.ui.window import PAGES

    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.show()
            for name in PAGES:
                w.show_page(name)
                w.resize(1024, 640)
                await asyncio.sleep(0.02)
                hint = w.minimumSizeHint()
                assert hint.width() <= 1024 and hint.height() <= 640, (name, hint)
                assert (w.width(), w.height()) == (1024, 640), (name, w.size())

    qloop.run_until_complete(asyncio.wait_for(scenario(), 90))


def test_a_repository_with_no_file_that_fits_suggests_a_smaller_model(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    """When no quantization of a repository fits, Discover says so on the model's page and its Download
    warning points to a model with fewer parameters (no smaller file of this one would do)."""
    from app.ui.desktop import Desktop
    from app.ui.pages.discover import NONE_FITS

    big = write_tiny_gguf(tmp_path / "src" / "m-Q8_0.gguf", MEDIUM)
    fake_hub.add_repo(MIXED, {"m-Q8_0.gguf": big}, tags=["gguf"])
    paths = Paths(home=isolated_env)
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, ctx_size=12 << 20, parallel=1
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            await disc.open_model(MIXED)
            assert disc.quants.item(0, 2).text() == "does not fit"
            assert "fewer parameters" in disc.model_meta.text()
            assert disc.download("Q8_0", disc.quants.cellWidget(0, 5)) is None
            said = disc.status.text()
            assert NONE_FITS in said and "Press Download anyway again" in said, said
            assert not desk.runtime.downloads.jobs

    qloop.run_until_complete(asyncio.wait_for(scenario(), 90))
