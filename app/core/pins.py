"""Per-model lane pins in `pins.json` in SWITCHYARD_HOME; a corrupt file is reported, never rewritten."""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.core.errors import SettingsError


def load_pins(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix or remove it"
        ) from exc
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise SettingsError(f"{path} must map model ids to lane names")
    return raw


def save_pins(path: Path, pins: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(pins, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a crash never leaves half a file
