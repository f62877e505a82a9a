"""What the window remembers between runs (SWITCHYARD_HOME/ui.json): geometry, last page, notices shown."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class UiState:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            self.data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        except (OSError, ValueError):
            self.data = {}  # unreadable: start fresh; the file is replaced on the next save

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2), encoding="utf-8")
        os.replace(tmp, self.path)
