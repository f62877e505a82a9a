"""The desktop as Windows code (checks/desktop_checks.py, one python.exe): the real Desktop with every page
in both themes at 1024x640, the single-instance pipe between two launches, start at login through the Run
key, dropped and pasted images, the tray's absence. Qt's offscreen platform: wine 8.0 cannot show Qt's
native Windows window (docs/install.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from app.ui.pages.registry import TITLES
from tests.windows.conftest import check_names, judge
from tests.windows.wine import Result, WinePython, win_path

pytestmark = pytest.mark.timeout(400)  # the module's one python.exe run, on a loaded machine

NAMES = check_names("desktop_checks.py")
# the offscreen platform reads its fonts from one folder (a real Windows window asks the system)
FONTS = next(
    (p for p in (Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/truetype")) if p.is_dir()),
    None,
)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("windows desktop shots")


@pytest.fixture(scope="module")
def results(wine: WinePython, shots: Path) -> Result:
    assert FONTS is not None, (
        "no TrueType fonts on this machine for Qt's offscreen platform (fonts-dejavu-core)"
    )
    return wine.run("desktop_checks.py", win_path(shots), env={"SY_QT_FONTDIR": win_path(FONTS)}, timeout=300)


def test_every_check_ran(results: Result) -> None:
    assert results.returncode == 0, results.tail()
    assert sorted(results.by_check()) == sorted(NAMES), results.tail()


@pytest.mark.parametrize("name", NAMES)
def test_windows_desktop(results: Result, name: str) -> None:
    judge(results, name)


def test_each_page_was_drawn_at_1024x640_in_both_themes(results: Result, shots: Path) -> None:
    judge(results, "every_page_renders")
    for title in TITLES:
        for theme in ("light", "dark"):
            path = shots / f"{title.lower()}-{theme}.png"
            assert path.is_file(), f"no screenshot of {title} ({theme})"
            with Image.open(path) as image:
                assert image.size == (1024, 640), (path.name, image.size)
                # text was drawn with real glyphs: a page of missing-glyph boxes has almost no grey levels
                grey = image.convert("L")
                assert len(set(grey.getdata())) > 16, f"{path.name} has no antialiased text"
    light, dark = (Image.open(shots / f"server-{t}.png").convert("L") for t in ("light", "dark"))
    mean = [sum(im.getdata()) / (im.width * im.height) for im in (light, dark)]
    assert mean[0] > mean[1] + 40, f"the dark theme is not darker under Windows: {mean}"
