"""Every text meets WCAG AA in both themes (issue 32 item 8): each text/background pair of the palette the
window sets, the coloured words (errors, "Running", tags), and, on the real widgets, an error line, the
links of a conversation drawn before a theme switch, and the keyboard focus ring (3:1, non-text)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtGui import QColor, QPalette, QTextCharFormat
from PySide6.QtWidgets import QApplication, QPushButton

from app.core.paths import Paths
from app.core.settings import Settings

R, G = QPalette.ColorRole, QPalette.ColorGroup
TEXT_PAIRS = (
    (R.Text, R.Base),
    (R.Text, R.AlternateBase),
    (R.WindowText, R.Window),
    (R.ButtonText, R.Button),
    (R.HighlightedText, R.Highlight),
    (R.Link, R.Base),
    (R.Link, R.Window),
    (R.LinkVisited, R.Base),
    (R.PlaceholderText, R.Base),
    (R.ToolTipText, R.ToolTipBase),
)
AA = 4.5
NON_TEXT = 3.0


def luminance(c: QColor) -> float:
    def channel(v: int) -> float:
        x = v / 255
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(c.red()) + 0.7152 * channel(c.green()) + 0.0722 * channel(c.blue())


def over(fg: QColor, bg: QColor) -> QColor:
    """`fg` as drawn on `bg` (a translucent colour, Qt's placeholder text for one, is blended)."""
    a = fg.alphaF()
    return QColor(
        *(round(f * a + b * (1 - a)) for f, b in zip(fg.getRgb()[:3], bg.getRgb()[:3], strict=True))
    )


def contrast(fg: QColor, bg: QColor) -> float:
    hi, lo = sorted((luminance(over(fg, bg)), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_arithmetic_matches_wcag() -> None:
    assert contrast(QColor("#000000"), QColor("#ffffff")) == pytest.approx(21.0)
    assert contrast(QColor("#777777"), QColor("#ffffff")) == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_palette_and_tones_meet_aa(qapp: Any, scheme: str) -> None:
    from app.ui import theme

    t = theme.apply(qapp)
    try:
        t.set(scheme)
        pal = QApplication.palette()
        assert theme.is_dark(pal) is (scheme == "dark")
        low = []
        for group in (G.Active, G.Inactive):
            for fg, bg in TEXT_PAIRS:
                ratio = contrast(pal.color(group, fg), pal.color(group, bg))
                if ratio < AA:
                    low.append(f"{group.name} {fg.name} on {bg.name}: {ratio:.2f}")
        for name in ("error", "ok", "accent", "muted"):
            for bg in (R.Window, R.Base, R.AlternateBase):
                ratio = contrast(QColor(theme.tone(name)), pal.color(bg))
                if ratio < AA:
                    low.append(f"tone {name} on {bg.name}: {ratio:.2f}")
        for bg in (R.Window, R.Button, R.Base):  # the focus ring beside what it surrounds
            ratio = contrast(QColor(theme.tone("focus")), pal.color(bg))
            if ratio < NON_TEXT:
                low.append(f"focus ring on {bg.name}: {ratio:.2f}")
        for bg in (R.Window, R.Base):  # a field's edge: the window outside it, its fill inside
            ratio = contrast(QColor(theme.tone("border")), pal.color(bg))
            if ratio < NON_TEXT:
                low.append(f"field edge on {bg.name}: {ratio:.2f}")
        assert not low, f"{scheme}: " + "; ".join(low)
    finally:
        t.set("system")


def _anchor_colours(doc: Any) -> list[QColor]:
    out = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt: QTextCharFormat = frag.charFormat()
            if frag.isValid() and fmt.isAnchor():
                out.append(fmt.foreground().color())
            it += 1
        block = block.next()
    return out


def test_widgets_follow_a_theme_switch(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), idle_ttl_s=0, monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            w.show()
            desk.theme.set("light")
            chat = w.show_page("Chat")
            cid = desk.chats.create("links", model=None, system_prompt="")
            desk.chats.add(cid, "user", "where are the docs?")
            desk.chats.add(cid, "assistant", "See [the docs](https://example.com/docs).")
            chat.open(cid)
            chat.report("The local server is stopped: start it on the Server page.")
            await asyncio.sleep(0.05)
            for scheme in ("dark", "light", "dark"):
                desk.theme.set(scheme)
                await asyncio.sleep(0.05)
                pal = QApplication.palette()
                base, window = pal.color(R.Base), pal.color(R.Window)
                links = _anchor_colours(chat.view.document())
                assert len(links) >= 2, "the reply's link and its Read aloud link"
                worst = min(contrast(c, base) for c in links)
                assert worst >= AA, f"{scheme}: a link drawn before the switch is at {worst:.2f}:1"
                err = contrast(chat.status.colour(), window)
                assert err >= AA, f"{scheme}: the error line is at {err:.2f}:1"
            # the keyboard focus ring is drawn, in the focus colour, around a focused button (dark theme)
            button = QPushButton("Focus me", w)
            button.resize(120, 32)
            button.show()
            button.setFocus()
            await asyncio.sleep(0.05)
            assert button.hasFocus()
            from app.ui.theme import tone

            ring = QColor(tone("focus"))
            img = button.grab().toImage()
            hits = sum(
                1
                for x in range(img.width())
                for y in (1, 2, img.height() - 2, img.height() - 3)
                if _near(QColor(img.pixel(x, y)), ring)
            )
            assert hits > img.width(), f"the focus ring is not drawn ({hits} pixels in its colour)"
            button.clearFocus()
            await asyncio.sleep(0.05)
            img = button.grab().toImage()
            assert not any(_near(QColor(img.pixel(x, 1)), ring) for x in range(img.width())), (
                "a ring without focus"
            )
            desk.theme.set("system")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 60))


def _near(a: QColor, b: QColor) -> bool:
    return all(abs(x - y) <= 40 for x, y in zip(a.getRgb()[:3], b.getRgb()[:3], strict=True))


def test_a_why_window_follows_a_theme_switch(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    """The misfit's "over the limit" words, made in the light theme, are redrawn legibly in the dark one;
    its speed is never "0-0 tok/s"."""
    from PySide6.QtWidgets import QLabel

    from app.ui.desktop import Desktop
    from app.ui.explain_view import ExplainDialog
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    write_tiny_gguf(tmp_path / "models" / "tiny.gguf", CHAT)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), idle_ttl_s=0, monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            desk.theme.set("light")
            over = await desk.runtime.explain("tiny", overrides={"ctx_size": 200_000_000, "kv_type": "f32"})
            dlg = ExplainDialog("tiny", over.public(), desk.window)
            dlg.show()
            desk.theme.set("dark")
            await asyncio.sleep(0.05)
            texts = [lab.text() for lab in dlg.findChildren(QLabel)]
            line = next(t for t in texts if "over the limit" in t)
            colour = QColor(re.search(r"color:(#[0-9a-fA-F]{6})", line).group(1))  # type: ignore[union-attr]
            ratio = contrast(colour, QApplication.palette().color(R.Window))
            assert ratio >= AA, f"'over the limit' at {ratio:.2f}:1 after the switch"
            speed = next(t for t in texts if "<b>Speed</b>" in t)
            assert "0-0 tok/s" not in speed, speed
            dlg.close()
            desk.theme.set("system")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 60))
