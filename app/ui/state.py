"""What the window remembers between runs (SWITCHYARD_HOME/ui.json): geometry, last page, notices shown.

Each change is merged into the file as it is at that moment, under its lock (app/core/statefile.py), so two
windows (or a window and a second instance) never drop each other's keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core import statefile


def _lenient(text: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError:
        return {}  # unreadable: start fresh; the file is replaced on the next save
    return raw if isinstance(raw, dict) else {}


class UiState:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            text = statefile.read_text(path)
        except OSError:
            text = None
        self.data: dict[str, Any] = _lenient(text) if text else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self._merge({key: value})

    def save(self) -> None:
        self._merge(dict(self.data))

    def _merge(self, changes: dict[str, Any]) -> None:
        merged = statefile.update(self.path, lambda cur: {**(cur or {}), **changes}, parse=_lenient)
        self.data = dict(merged)  # the file as it is now: our change beside others' since we read it
