"""The library as `switchyard ls`, GET /api/library and the GUI show it: a scan plus what library.db adds."""

from __future__ import annotations

from typing import Any

from app.core.settings import Settings
from app.library.catalog import Catalog
from app.library.store import Library


def listing(library: Library, catalog: Catalog, settings: Settings) -> list[dict[str, Any]]:
    """Each entry's public form (its projector as the model's `mmproj` override says), with files (sha256
    where known), added/last-used times and the smoke test of its current files (`smoke`, None when
    none ran on them yet) from library.db."""
    entries = catalog.scan()
    rows = {r["id"]: r for r in library.rows()}
    smoke = library.smoke()
    out = []
    for e in entries:
        row = rows.get(e.id, {})
        doc = e.public(settings)
        doc["files"] = row.get("files", [f.public() for f in e.files])
        doc["added_at"] = row.get("added_at")
        doc["last_used_at"] = row.get("last_used_at")
        tested = smoke.get(e.id)
        doc["smoke"] = tested.public() if tested is not None and tested.identity == e.identity() else None
        out.append(doc)
    return out
