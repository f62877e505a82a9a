"""Which vision projector (mmproj) loads with a text GGUF.

A projector pairs with a text model when it sits in the same folder (or the same Hugging Face snapshot)
and its `clip.vision.projection_dim` equals the text model's embedding length: llama.cpp refuses any other
at load. A header without that key pairs only when it is the one projector there. `model_overrides[id]
.mmproj` names one explicitly, which wins over the automatic choice: `ModelEntry.projector(settings)`
(library/model.py) is the one rule for which projector loads, and every surface asks it.
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import ModelBrokenError
from app.core.settings import Settings
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.library.model import ModelEntry, projector_for

__all__ = ["is_projector_file", "pair_projector", "projector_for", "projector_layout", "vision_projector"]


def is_projector_file(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".gguf") and "mmproj" in name


def projector_layout(path: Path) -> GGUFLayout | None:
    """The layout of a vision projector GGUF, or None for a file that is not one (or cannot be read)."""
    got = read_gguf_layout(path)
    if not isinstance(got, GGUFLayout) or got.projector is None or not got.projector.has_vision_encoder:
        return None
    return got


def _candidates(folder: Path, *, recursive: bool) -> list[Path]:
    try:
        found = folder.rglob("*.gguf") if recursive else folder.glob("*.gguf")
        return sorted(p for p in found if is_projector_file(p))
    except OSError:
        return []


def pair_projector(
    model_path: Path, *, embedding_length: int | None, snapshot: Path | None = None
) -> Path | None:
    """The projector beside `model_path` (anywhere in `snapshot` for a Hugging Face snapshot) whose
    projection width matches `embedding_length`; None when none does."""
    if embedding_length is None:
        return None
    folder = snapshot if snapshot is not None else model_path.parent
    found = _candidates(folder, recursive=snapshot is not None)
    unsized: list[Path] = []
    for cand in found:
        layout = projector_layout(cand)
        if layout is None or layout.projector is None:
            continue
        dim = layout.projector.projection_dim
        if dim == embedding_length:
            return cand
        if dim is None:
            unsized.append(cand)
    return unsized[0] if len(found) == 1 and unsized else None


def vision_projector(entry: ModelEntry, settings: Settings) -> tuple[Path, GGUFLayout] | None:
    """The vision projector this model loads with (`ModelEntry.projector`: the override, else the pairing)
    and its layout; ModelBrokenError, in words, for one that is missing, not a projector, or the wrong
    width."""
    override = settings.override(entry.id, "mmproj", None)
    path = entry.projector(settings)
    if path is None:
        return None
    fix = f"fix or remove model_overrides[{entry.id!r}].mmproj" if override else "remove or replace it"
    if not path.is_file():
        raise ModelBrokenError(f"the vision projector {path} for {entry.id!r} does not exist; {fix}")
    layout = projector_layout(path)
    if layout is None or layout.projector is None:
        raise ModelBrokenError(f"{path} is not a vision projector (mmproj) GGUF; {fix}")
    want = entry.facts.embedding_length if entry.facts else None
    got = layout.projector.projection_dim
    if want is not None and got is not None and got != want:
        raise ModelBrokenError(
            f"the vision projector {path.name} is for a text model of width {got}, but {entry.id!r} has "
            f"width {want}; llama.cpp would refuse it at load; use the projector from this model's "
            f"repository ({fix})"
        )
    return path, layout
