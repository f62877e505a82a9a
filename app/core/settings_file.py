"""Changing settings.json from the window (or any writer): only the keys it changes, under the file's lock.

The Settings page, the Tune panel and the Server page each change a few keys. Each change is applied to the
file as it is at that moment, under its lock (app/core/statefile.py), so a key changed meanwhile by another
window, page or an editor that wrote the file whole is kept, and nothing is written from a stale copy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.settings import settings_document, settings_from_mapping


def _parse(path: Path, text: str) -> dict[str, Any]:
    raw = settings_document(path, text)
    settings_from_mapping(raw, origin=str(path))  # a file the server would refuse is reported, not rewritten
    return raw


def update_settings(
    path: Path, change: Callable[[dict[str, Any]], None], *, origin: str | None = None
) -> dict[str, Any]:
    """Apply `change` (which edits the raw mapping in place) to settings.json under its lock and return
    what was written. Writes nothing, raising SettingsError, when the file is malformed or the result
    holds a value the server would refuse (`origin` names the source in that message)."""

    def apply(raw: dict[str, Any] | None) -> dict[str, Any]:
        doc = dict(raw or {})
        change(doc)
        settings_from_mapping(doc, origin=origin or str(path))
        return doc

    written: dict[str, Any] = statefile.update(path, apply, parse=lambda text: _parse(path, text))
    return written


def set_settings(path: Path, values: dict[str, Any], *, origin: str | None = None) -> dict[str, Any]:
    """Set these top-level keys of settings.json, keeping every other key as the file has it now."""
    return update_settings(path, lambda doc: doc.update(values), origin=origin)
