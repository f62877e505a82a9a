"""Per-model lane pins in `pins.json` in SWITCHYARD_HOME; a corrupt file is reported, never rewritten.

`PinStore` is the one owner of that file: the CLI, the server, the supervisor, the library's mirror and the
GUI all ask it. Changed only under the file's lock (app/core/statefile.py), so concurrent pins from several
processes are all kept."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import SettingsError


@dataclass(frozen=True)
class PinStore:
    """Reads pins.json fresh on every call (another process may have pinned since); a corrupt file raises
    SettingsError on read and is never rewritten."""

    path: Path

    def all(self) -> dict[str, str]:
        """Every pin (empty when the file does not exist yet)."""
        return _load(self.path)

    def get(self, model_id: str) -> str | None:
        return _load(self.path).get(model_id)

    def set(self, model_id: str, lane: str | None) -> str | None:
        """Pin `model_id` to `lane` (None: unpin) and return its previous lane."""
        return _set(self.path, model_id, lane)

    def replace(self, pins: dict[str, str]) -> None:
        """Replace every pin with `pins` (durably, under the file's lock); prefer `set` to change one."""
        statefile.update(self.path, lambda _old: dict(pins), parse=str, dump=_dump)


def _load(path: Path) -> dict[str, str]:
    text = statefile.read_text(path)
    return {} if text is None else _parse(path, text)


def _parse(path: Path, text: str) -> dict[str, str]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix or remove it"
        ) from exc
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise SettingsError(f"{path} must map model ids to lane names")
    return raw


def _dump(pins: dict[str, str]) -> str:
    return json.dumps(pins, indent=2, sort_keys=True)


def _set(path: Path, model_id: str, lane: str | None) -> str | None:
    # a locked read-modify-write, so pins set at the same time by the CLI and the window are all kept
    before: list[str | None] = []

    def change(pins: dict[str, str] | None) -> Any:
        pins = dict(pins or {})
        before.append(pins.get(model_id))
        if lane is None and before[0] is None:
            return statefile.KEEP
        if lane is None:
            pins.pop(model_id)
        else:
            pins[model_id] = lane
        return pins

    statefile.update(path, change, parse=lambda text: _parse(path, text), dump=_dump)
    return before[0]
