"""Where each app keeps its models, per operating system, and the stores the settings ask for.

`SWITCHYARD_APPS_HOME` replaces the home folder the defaults are found under (a service account reading
its user's stores; the tests, so that a developer's own Ollama never shows up in them); while it is set,
`OLLAMA_MODELS` and the system-wide Ollama service folder are not consulted either.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import Settings

# the Linux Ollama service (install.sh) runs as the `ollama` user, whose store is here
_OLLAMA_SERVICE = Path("/usr/share/ollama/.ollama/models")
APP_NAMES = {
    "ollama": "Ollama",
    "lmstudio": "LM Studio",
    "jan": "Jan",
    "gpt4all": "GPT4All",
    "folder": "a shared folder",
}


@dataclass(frozen=True)
class AppStore:
    """One store to read: the app that owns it and its root folder (Ollama's `models`, holding
    `manifests/` and `blobs/`; the others' models folders)."""

    app: str
    root: Path

    @property
    def app_name(self) -> str:
        return APP_NAMES.get(self.app, self.app)


def app_stores(settings: Settings, *, env: Mapping[str, str] | None = None) -> tuple[AppStore, ...]:
    """The stores to scan: per app in `settings.app_stores`, its `app_store_paths` folder when set, else
    the first of its default folders that exists (else the first default, so a store made later is
    found on a rescan); then each of `shared_model_dirs`."""
    env = os.environ if env is None else env
    out: list[AppStore] = []
    for app in settings.library.app_stores:
        chosen = settings.library.app_store_paths.get(app)
        if chosen is not None:
            out.append(AppStore(app, Path(chosen).expanduser()))
            continue
        candidates = default_roots(app, env=env)
        root = next((c for c in candidates if c.is_dir()), candidates[0] if candidates else None)
        if root is not None:
            out.append(AppStore(app, root))
    out.extend(AppStore("folder", Path(d)) for d in settings.library.shared_model_dirs)
    return tuple(out)


def default_roots(app: str, *, env: Mapping[str, str]) -> list[Path]:
    """The folders `app` keeps its models in by default on this operating system, most likely first."""
    pinned = env.get("SWITCHYARD_APPS_HOME")
    home = Path(pinned) if pinned else Path.home()
    if app == "ollama":
        if not pinned and env.get("OLLAMA_MODELS"):
            return [Path(env["OLLAMA_MODELS"]).expanduser()]
        found = [home / ".ollama" / "models"]
        return found if pinned or sys.platform != "linux" else [*found, _OLLAMA_SERVICE]
    if app == "lmstudio":  # 0.3+ keeps ~/.lmstudio; earlier versions ~/.cache/lm-studio
        return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    data = _data_dir(home, env=env, pinned=bool(pinned))
    if app == "jan":  # 0.6+ keeps llama.cpp models under its data folder; earlier versions ~/jan/models
        return [data / "Jan" / "data" / "llamacpp" / "models", home / "jan" / "models"]
    if app == "gpt4all":
        return [data / "nomic.ai" / "GPT4All"]
    return []


def _data_dir(home: Path, *, env: Mapping[str, str], pinned: bool) -> Path:
    """The per-user application data folder (XDG on Linux, Application Support on macOS, LOCALAPPDATA on
    Windows)."""
    if sys.platform == "darwin":
        return home / "Library" / "Application Support"
    if sys.platform == "win32":
        local = env.get("LOCALAPPDATA")
        return Path(local) if local and not pinned else home / "AppData" / "Local"
    xdg = env.get("XDG_DATA_HOME")
    return Path(xdg) if xdg and not pinned else home / ".local" / "share"
