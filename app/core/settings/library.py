"""Where models come from: the library's folders and other apps' stores (library), the Hugging Face hub
(hub) and how downloads run (downloads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from app.core.errors import SettingsError

# the apps whose model stores are read in place (app/library/app_stores/); `folder` is shared_model_dirs
APP_STORES = ("ollama", "lmstudio", "jan", "gpt4all")


@dataclass(frozen=True)
class LibrarySettings:
    models_dirs: tuple[Path, ...] = ()
    # other apps' model stores read in place (docs/library.md#other-apps-stores): which apps, a folder per
    # app where it is not the app's default, and shared folders of the user's own (read-only too)
    app_stores: tuple[str, ...] = APP_STORES
    app_store_paths: dict[str, str] = field(default_factory=dict)
    shared_model_dirs: tuple[Path, ...] = ()
    # list the starter model shipped as a Python package (app/library/starter.py) in the library
    starter_model: bool = True

    def __post_init__(self) -> None:
        for name in (*self.app_stores, *self.app_store_paths):
            if name not in APP_STORES:
                raise SettingsError(
                    f"app_stores/app_store_paths name {name!r}, not an app whose store Switchyard reads; "
                    f"use some of {', '.join(APP_STORES)} (shared_model_dirs takes folders of your own)"
                )
        for name, folder in self.app_store_paths.items():
            if not isinstance(folder, str) or not folder.strip():
                raise SettingsError(f"app_store_paths[{name!r}] must be a folder path, got {folder!r}")


@dataclass(frozen=True)
class HubSettings:
    """Hugging Face (docs/hub.md); None means: the HF_* environment, then the default."""

    hf_endpoint: str | None = None
    hf_proxy: str | None = None
    hf_cache_dir: str | None = None
    offline: bool = False
    hf_token_file: bool = False  # opt-in: keep the HF token in a 0600 file where no keyring exists

    def __post_init__(self) -> None:
        for name in ("hf_endpoint", "hf_proxy"):
            value = getattr(self, name)
            if value is not None and urlsplit(value).scheme not in ("http", "https"):
                raise SettingsError(f"{name} must be an http:// or https:// URL, got {value!r}")


@dataclass(frozen=True)
class DownloadSettings:
    download_concurrency: int = 2
    download_parts: int = 4

    def __post_init__(self) -> None:
        for name in ("download_concurrency", "download_parts"):
            if not 1 <= getattr(self, name) <= 32:
                raise SettingsError(f"{name} must be between 1 and 32")
