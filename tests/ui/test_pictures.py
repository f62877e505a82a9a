"""Issue 20's pictures, on the real desktop: the Hardware graphs' axes, units and legend; the Lanes page's
per-lane strips fed by real `request.done` and `hardware.sample` events; the Why? memory bar for a fit and
for a misfit (the overflow past the device's limit, checked on the bar's computed layout, not on pixels);
the Tune panel whole in a 1024x640 window; both themes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtWidgets import QLabel

from app.core.paths import Paths
from app.core.settings import Settings
from tests.support.asyncwait import until
from tests.support.tinymodels import CHAT, write_tiny_gguf

MODEL = "tiny-pictures"


def test_a_disabled_button_stays_legible_in_the_dark_theme(qapp: Any) -> None:
    """The engines' Install/Update/Rollback, greyed out, were blank on dark: their text within 26
    lightness steps of the face Fusion draws for a disabled button."""
    from PySide6.QtWidgets import QPushButton

    from app.ui.theme import apply

    theme = apply(qapp)
    theme.set("dark")
    try:
        b = QPushButton("Rollback")
        b.setEnabled(False)
        b.resize(120, 30)
        img = b.grab().toImage()
        inner = [img.pixelColor(x, y).lightness() for x in range(8, 112) for y in range(6, 24)]
        face = max(set(inner), key=inner.count)  # the commonest shade inside the frame is the face
        assert max(inner) - face >= 50, (face, max(inner))
    finally:
        theme.set("light")


def test_graph_scale_follows_its_values_and_unit(qapp: Any) -> None:
    from app.ui.charts import Graph, LaneHistory, nice_top

    g = Graph("Generation", unit="tok/s", series=[("all lanes", "#e53935")], span=120)
    assert g.axes() == (["1 tok/s", "0.5 tok/s", "0 tok/s"], ["2 min ago", "1 min ago", "now"])
    g.set_line(0, [3.0, 37.0, 12.0])
    assert g.axes()[0] == ["50 tok/s", "25 tok/s", "0 tok/s"]  # rounded up from the peak
    assert [nice_top(v) for v in (0.3, 1, 7, 180, 5000)] == [0.5, 1, 10, 200, 5000]
    # 30 tokens from 999.0 to 1000.5: 20 tok/s through second 999, half of that in second 1000
    h = LaneHistory(span=300)
    h.add_request("m", tokens=30, seconds=1.5, now=1000.5)
    assert h.rates("m", now=1002) == [20.0, 10.0, 0.0, 0.0]
    assert h.rates("other", now=1002) == []


def test_pictures_on_the_real_desktop(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.charts import Sparkline, shade
    from app.ui.desktop import Desktop
    from app.ui.explain_view import ExplainView, MemoryBar

    write_tiny_gguf(tmp_path / "models" / f"{MODEL}.gguf", CHAT)
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), idle_ttl_s=0, monitor_interval_s=0.25
    )

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            lib = w.show_page("Library")
            await desk.tasks.settle()
            assert lib.select(MODEL)
            # Tune: every control in view at 1024x640, no sideways scrolling
            await asyncio.sleep(0.05)
            area = lib.tune.parentWidget().parentWidget()
            assert lib.tune.minimumSizeHint().width() <= area.width() <= 1024, area.width()
            lib.load()
            await desk.tasks.settle(limit=90)
            # real requests through the server: each one's `request.done` carries its tokens and seconds
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24}
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    r = await s.post(
                        f"{desk.server.url}/v1/chat/completions", json={**body, "ignore_eos": True}
                    )
                    assert r.status == 200, await r.text()
            lanes = w.show_page("Lanes")
            hw = desk.window.pages["Hardware"]
            # the rate strip has a point per wall-clock second: two points need the clock to tick once
            await until(
                lambda: (
                    len(lanes.history.memory(MODEL)) >= 2
                    and len(lanes.history.rates(MODEL)) >= 2
                    and max(hw.speed.values[0], default=0) > 0
                ),
                what="a memory reading per tick, a second gone by, and the speed on the next tick",
            )
            assert max(lanes.history.rates(MODEL)) > 0
            assert lanes.strip_models == [MODEL]
            strips = lanes.strips.findChildren(Sparkline)
            assert len(strips) == 2 and all(len(s.points()) >= 2 for s in strips)
            assert strips[0].text().endswith("tok/s") and strips[1].text().endswith("iB")
            # Hardware: each graph's scale carries its unit, time runs to "now", a legend names the lines
            assert hw.cpu.axes() == (["100 %", "50 %", "0 %"], ["2 min ago", "1 min ago", "now"])
            assert all(label.endswith("GiB") for label in hw.ram.axes()[0])
            assert [e.split()[0:2] for e in hw.ram.legend()][:1] == [["in", "use"]]
            assert hw.ram.legend()[1].startswith("by lanes") and "iB" in hw.ram.legend()[1]
            assert hw.speed.axes()[0][0].endswith("tok/s") and hw.speed.legend()[0].endswith("tok/s")
            # Why?: the bar of a plan that fits stays inside the limit ...
            fits = ExplainView((await desk.runtime.explain(MODEL)).public())
            bar = fits.findChildren(MemoryBar)[0]
            layout = bar.bar_layout(400)
            assert bar.over == 0 and layout["overflow"][1] == 0 and layout["limit_x"] == 400
            text = " ".join(lab.text() for lab in fits.findChildren(QLabel))
            assert "free" in text and "<b>Speed</b>: predicted" in text
            assert "not measured yet" in text or "tok/s" in text.split("measured", 1)[1]
            # ... and one that does not fit draws its overflow past the limit line, to scale, with its size
            over = await desk.runtime.explain(MODEL, overrides={"ctx_size": 200_000_000, "kv_type": "f32"})
            assert over.fit is not None and not over.fit.fits
            miss = ExplainView(over.public())
            bar = next(b for b in miss.findChildren(MemoryBar) if b.over)
            layout = bar.bar_layout(400)
            start, width = layout["overflow"]
            assert start == layout["limit_x"] < 400 and start + width == pytest.approx(400)
            assert width / 400 == pytest.approx(bar.over / bar.total)
            assert "over the limit" in " ".join(lab.text() for lab in miss.findChildren(QLabel))
            # the dark theme: a darker base, and the graph's line colour lightened to stay legible on it
            desk.theme.set("dark")
            await asyncio.sleep(0.05)  # the palette reaches the widgets through posted events

            assert hw.palette().base().color().lightness() < 100
            assert (
                shade("#e53935", hw.palette()).lightness()
                > shade("#e53935", qapp.style().standardPalette()).lightness()
            )
            desk.theme.set("light")
            await asyncio.sleep(0.05)
            assert hw.palette().base().color().lightness() > 200
            desk.quit()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 120))
