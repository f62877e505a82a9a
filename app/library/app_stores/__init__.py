"""Models other apps keep, used where they are: Ollama's store, LM Studio's, Jan's and GPT4All's models
folders, and shared folders the user names (`shared_model_dirs`).

Everything here only reads: a store's files are its app's, so nothing is moved, renamed, deleted or
written, and `switchyard rm` refuses them (saying which app removes them). Each scan reads the stores
again, so a model another app deleted is gone from the next listing without an error, and a manifest
whose blob is missing (a pull or a removal under way) is skipped until it is whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.library.app_stores.folders import scan_folder_store
from app.library.app_stores.locations import AppStore, app_stores
from app.library.app_stores.ollama import scan_ollama
from app.library.model import ModelEntry
from app.library.sources import ReadGGUF

__all__ = ["AppStore", "app_stores", "scan_app_stores"]


def scan_app_stores(stores: Iterable[AppStore], *, read: ReadGGUF) -> list[ModelEntry]:
    """The models in each store that exists now; a store that is missing or unreadable lists nothing."""
    out: list[ModelEntry] = []
    for store in stores:
        if not store.root.is_dir():
            continue
        if store.app == "ollama":
            out.extend(scan_ollama(store.root, read=read))
        else:
            out.extend(scan_folder_store(store, read=read))
    return out
