"""The window's pages, in sidebar order: the one place a page is added.

Adding a page: a module in app/ui/pages/ with a `Page` subclass that sets `title` (its sidebar name; its
shortcut is Ctrl+<position>), then one entry in PAGES below. tests/ui/test_page_registry.py checks that every
Page subclass on disk is here, once, with a title of its own.
"""

from __future__ import annotations

from app.ui.pages import Page
from app.ui.pages.chat import ChatPage
from app.ui.pages.discover import DiscoverPage
from app.ui.pages.hardware import HardwarePage
from app.ui.pages.lanes import LanesPage
from app.ui.pages.library import LibraryPage
from app.ui.pages.machines import MachinesPage
from app.ui.pages.server import ServerPage
from app.ui.pages.settings import SettingsPage

PAGES: tuple[type[Page], ...] = (
    DiscoverPage,
    LibraryPage,
    ChatPage,
    ServerPage,
    LanesPage,
    MachinesPage,
    HardwarePage,
    SettingsPage,
)
TITLES: tuple[str, ...] = tuple(p.title for p in PAGES)
