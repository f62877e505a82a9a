"""Measured footprints in library.db, with the interface of app.lanes.footprint.FootprintStore.

The supervisor calls `record(lane)` when a lane is ready; explain asks `get(model_id, path=...)`. Figures are
tied to the file's size and mtime, so a replaced file's old figures are never shown as its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.library.store import Library


class LibraryFootprints:
    def __init__(self, library: Library) -> None:
        self.library = library

    def record(self, lane: Any) -> None:
        """Store the lane's predicted memory beside llama.cpp's own figures, and its model's last use."""
        if lane.plan is None or lane.measured is None:
            return
        path = Path(lane.plan.params.model_path)
        st = path.stat()
        self.library.put_footprint(
            lane.model_id,
            {
                "file": str(path),
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "at": time.time(),
                "params": lane.plan.public()["params"],
                "predicted": lane.plan.predicted(),
                "measured": lane.measured.public(),
            },
        )

    def get(self, model_id: str, *, path: Path) -> dict[str, Any] | None:
        entry = self.library.footprint(model_id)
        if entry is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        if entry.get("size") != st.st_size or entry.get("mtime_ns") != st.st_mtime_ns:
            return None  # the file changed since: those figures belong to another file
        return entry
