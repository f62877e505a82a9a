"""Measured footprints in library.db, with the interface of app.lanes.footprint.FootprintStore.

The supervisor calls `record(lane)` when a lane is ready; explain asks `get(model_id, path=...)`. Figures are
tied to the file's size and mtime, so a replaced file's old figures are never shown as its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.library.store import Library


def footprint_entry(lane: Any) -> dict[str, Any] | None:
    """What a ready lane's footprint record holds: its plan's prediction beside llama.cpp's own figures,
    tied to the model file's size and mtime; None while the lane has no plan or no measured figures."""
    if lane.plan is None or lane.measured is None:
        return None
    path = Path(lane.plan.params.model_path)
    st = path.stat()
    return {
        "file": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "at": time.time(),
        "params": lane.plan.public()["params"],
        "predicted": lane.plan.predicted(),
        "measured": lane.measured.public(),
    }


def still_current(entry: object, *, path: Path) -> dict[str, Any] | None:
    """`entry` while the file at `path` is the one it was measured on (same size and mtime); else None."""
    if not isinstance(entry, dict):
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    if entry.get("size") != st.st_size or entry.get("mtime_ns") != st.st_mtime_ns:
        return None  # the file changed since: those figures belong to another file
    return entry


class LibraryFootprints:
    def __init__(self, library: Library) -> None:
        self.library = library

    def record(self, lane: Any) -> None:
        """Store the lane's predicted memory beside llama.cpp's own figures, and its model's last use."""
        if (entry := footprint_entry(lane)) is not None:
            self.library.put_footprint(lane.model_id, entry)

    def get(self, model_id: str, *, path: Path) -> dict[str, Any] | None:
        return still_current(self.library.footprint(model_id), path=path)
