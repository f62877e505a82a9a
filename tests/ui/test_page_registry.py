"""The page registry (app/ui/pages/registry.py) is the one list of the window's pages: every Page subclass on
disk is in it once, each with a title of its own, and the window builds its sidebar and shortcuts from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from app.ui import window
from app.ui.pages import Page
from app.ui.pages.registry import PAGES, TITLES

REPO = Path(__file__).resolve().parents[2]


def _page_classes_on_disk() -> set[str]:
    names = set()
    for f in sorted((REPO / "app" / "ui" / "pages").glob("*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "Page" for b in node.bases
            ):
                names.add(node.name)
    return names


def test_every_page_on_disk_is_registered_once() -> None:
    assert {p.__name__ for p in PAGES} == _page_classes_on_disk()
    assert len(set(PAGES)) == len(PAGES)


def test_each_page_has_its_own_title() -> None:
    assert all(issubclass(p, Page) and p.title for p in PAGES)
    assert len(set(TITLES)) == len(TITLES) == len(PAGES)


def test_the_window_reads_the_registry() -> None:
    assert window.PAGES == TITLES
    assert f"Ctrl+{len(TITLES)}" in window.SHORTCUTS[0][0]


def test_the_window_asks_the_runtime_never_the_supervisor() -> None:
    reaches = [
        f"{f.relative_to(REPO)}:{n}"
        for f in sorted((REPO / "app" / "ui").rglob("*.py"))
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if ".supervisor" in line
    ]
    assert not reaches, f"ask the Runtime (app/runtime.py: lane_of, live_lanes, load, unload...): {reaches}"


def test_pages_are_typed() -> None:
    untyped = [
        f"{f.relative_to(REPO)}:{n}"
        for f in sorted((REPO / "app" / "ui").rglob("*.py"))
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if "desk: Any" in line or "runtime: Any" in line or "supervisor: Any" in line
    ]
    assert not untyped, untyped
