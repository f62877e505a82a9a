"""The library as `switchyard ls`, GET /api/library and the GUI show it: a scan plus what library.db adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.errors import SettingsError
from app.core.settings import Settings
from app.core.speculation import adapters_of
from app.library.catalog import Catalog
from app.library.model import ModelEntry
from app.library.pairing import AdapterPairing
from app.library.store import Library

ADAPTER_STATUS = "adapter"  # listed, loaded with its base model, never served on its own


def listing(library: Library, catalog: Catalog, settings: Settings) -> list[dict[str, Any]]:
    """Each entry's public form (its projector as the model's `mmproj` override says), with files (sha256
    where known), added/last-used times and the smoke test of its current files (`smoke`, None when
    none ran on them yet) from library.db. A LoRA adapter has status `adapter`, its note as `problem`
    (whose adapter it is and how it loads, or why no model in the library takes it) and `adapter`: what
    it adapts, `bases` (the models it pairs with), `why` (none does) and `loaded_by` (the bases whose
    `lora` setting names it)."""
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
        if (pairing := catalog.adapter(e.id)) is not None:
            doc |= _adapter_doc(e, pairing, catalog, settings)
        out.append(doc)
    return out


def _adapter_doc(
    e: ModelEntry, pairing: AdapterPairing, catalog: Catalog, settings: Settings
) -> dict[str, Any]:
    loaded_by = [b for b in pairing.bases if _loads(catalog.find(b), e.path, settings)]
    note = pairing.note()
    if loaded_by:  # already in use: say with which model, rather than how to set it up
        note = (
            f"LoRA adapter of {', '.join(pairing.bases)}, not a model of its own; loaded with "
            f"{', '.join(loaded_by)} (its lora setting names it)"
        )
    return {
        "status": ADAPTER_STATUS,
        "problem": note,
        "adapter": {**pairing.public(), "loaded_by": loaded_by},
    }


def _loads(base: ModelEntry | None, adapter: Path, settings: Settings) -> bool:
    """Whether `base`'s `lora` setting names the file `adapter` (a path relative to the base's folder,
    or absolute)."""
    if base is None:
        return False
    try:
        listed = adapters_of(settings.override(base.id, "lora", None))
    except SettingsError:
        return False
    want = _real(adapter)
    for a in listed:
        path = Path(a.file).expanduser()
        if _real(path if path.is_absolute() else base.path.parent / path) == want:
            return True
    return False


def _real(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)
