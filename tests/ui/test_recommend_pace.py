"""Issue 31, loose end of defect 14: the window's Recommended view says what `switchyard recommend` says when
nothing that fits is fast on this machine (Recommendations.pace), word for word."""

from __future__ import annotations

import asyncio
import html
import os
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication


def test_a_slow_machine_is_told_nothing_is_fast(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    pytest.importorskip("qasync")
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.hardware.bandwidth import machine_fingerprint, write_cache
    from app.hardware.model import Bandwidth
    from app.ui.desktop import Desktop

    # memory this slow (measured, so nothing is measured here) makes every model that fits slow
    bw = Bandwidth(single_core=20 * 10**6, all_cores=40 * 10**6, threads=2, measured_at=time.time())
    write_cache(isolated_env / "hardware.json", bw, fingerprint=machine_fingerprint())
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            view = disc.recommend
            task = disc.show_recommendations() or view.refresh()
            await task
            await desk.tasks.settle()
            paces = (view.doc or {}).get("pace") or {}
            assert paces.get("chat"), view.doc  # the CLI's sentence for this machine
            shown = html.unescape(view.note.text())
            for sentence in paces.values():
                assert sentence in shown, (sentence, shown)
            assert "nothing in the list is fast enough for chat on this machine" in shown

    qloop.run_until_complete(scenario())
