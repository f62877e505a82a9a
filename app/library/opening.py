"""Opening the library and its catalog from settings and paths: the one place that assembles the two.

The Runtime, the CLI commands that run without a server and the advice functions all open it here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from app.core.paths import Paths
from app.core.settings import Settings
from app.hub.config import hub_config
from app.library.app_stores import app_stores
from app.library.catalog import Catalog
from app.library.starter import find_starter
from app.library.store import Library


def warn_on_stderr(notice: str) -> None:
    print(f"switchyard: warning: {notice}", file=sys.stderr)


def open_catalog(
    settings: Settings, paths: Paths, *, notice: Callable[[str], None] = warn_on_stderr
) -> tuple[Library, Catalog]:
    """The opened library (the caller closes it) and a catalog over the models folders; nothing is scanned
    yet. `notice` hears what the library repaired or could not read while opening."""
    library = Library.open(paths)
    for text in library.notices:
        notice(text)
    dirs = settings.library.models_dirs or (paths.models,)
    starter = find_starter() if settings.library.starter_model else None
    cache = hub_config(settings).cache_dir
    stores = app_stores(settings)
    return library, Catalog(dirs, library=library, hf_cache=cache, starter=starter, stores=stores)


@contextlib.contextmanager
def opened_catalog(
    settings: Settings, paths: Paths, *, notice: Callable[[str], None] = warn_on_stderr
) -> Iterator[tuple[Library, Catalog]]:
    """`open_catalog` for a command's span: the library is closed when the block ends, however it ends."""
    library, catalog = open_catalog(settings, paths, notice=notice)
    try:
        yield library, catalog
    finally:
        library.close()
