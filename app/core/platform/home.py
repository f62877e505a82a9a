"""Where Switchyard keeps its data on each OS (SWITCHYARD_HOME, read by core/paths.py, overrides it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path


def data_home(env: Mapping[str, str] | None = None, *, system: str = sys.platform) -> Path:
    """The per-user data folder: %LOCALAPPDATA%\\Switchyard on Windows (local, not roaming: models are
    large and belong to this machine), ~/Library/Application Support/Switchyard on macOS, and
    $XDG_DATA_HOME/switchyard (~/.local/share/switchyard) elsewhere."""
    env = os.environ if env is None else env
    if system == "darwin":
        return Path.home() / "Library" / "Application Support" / "Switchyard"
    if system == "win32":
        base = env.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "Switchyard"
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "switchyard"
