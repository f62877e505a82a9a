"""Ollama's store read in place: each manifest names its GGUF weights (and template, projector, config)
as blobs by sha256 digest; the model is listed as `ollama:NAME:TAG` and served from the blob itself.

Layout (as Ollama writes it): `manifests/<registry>/<namespace>/<model>/<tag>` (JSON, Docker's v2
manifest shape) and `blobs/sha256-<hex>` (older versions: `sha256:<hex>`). Models of the default
registry and namespace are named `model:tag`, as `ollama list` shows them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from app.library.model import FileInfo, ModelEntry, Owner
from app.library.sources import ReadGGUF, file_info, gguf_entry

PREFIX = "ollama:"
_REGISTRY = "registry.ollama.ai"
_LIBRARY = "library"
_MODEL = "application/vnd.ollama.image.model"
_TEMPLATE = "application/vnd.ollama.image.template"
_PROJECTOR = "application/vnd.ollama.image.projector"
_ADAPTER = "application/vnd.ollama.image.adapter"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
_MANIFEST_MAX = 1 << 20  # a manifest is a few hundred bytes; anything near this is not one
_TEXT_MAX = 64 << 10  # a template or config blob shown, not a model file


def scan_ollama(root: Path, *, read: ReadGGUF) -> list[ModelEntry]:
    """Every complete model in the store at `root` (the folder holding `manifests/` and `blobs/`)."""
    manifests = root / "manifests"
    out: list[ModelEntry] = []
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            parts = path.relative_to(manifests).parts
            if len(parts) != 4 or name.startswith("."):
                continue
            entry = _entry(root, _model_name(parts), path, read=read)
            if entry is not None:
                out.append(entry)
    return out


def _model_name(parts: tuple[str, ...]) -> str:
    """`llama3.2:latest`, `user/model:tag` or `host/ns/model:tag`, as `ollama list` names them."""
    registry, namespace, model, tag = parts
    if registry == _REGISTRY:
        return f"{model}:{tag}" if namespace == _LIBRARY else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def _entry(root: Path, name: str, manifest: Path, *, read: ReadGGUF) -> ModelEntry | None:
    """The model a manifest names, or None while it is not whole (no weights layer, a blob missing: a
    pull or a removal in progress) or it is not a manifest at all."""
    doc = _json(manifest, _MANIFEST_MAX)
    if not isinstance(doc, dict) or not isinstance(layers := doc.get("layers"), list):
        return None
    by_type: dict[str, Path] = {}
    for layer in layers:
        if isinstance(layer, dict) and (blob := _blob(root, layer.get("digest"))) is not None:
            by_type.setdefault(str(layer.get("mediaType")), blob)
    weights = by_type.get(_MODEL)
    if weights is None or not weights.is_file():
        return None
    config = doc.get("config")
    facts = _json(_blob(root, config.get("digest")) if isinstance(config, dict) else None, _TEXT_MAX)
    facts = facts if isinstance(facts, dict) else {}
    projector = by_type.get(_PROJECTOR)
    entry = gguf_entry(PREFIX + name, weights, read=read, source="app_store", location=root, sha=_sha_of_blob)
    if projector is not None and projector.is_file():
        entry = replace(entry, mmproj=projector, files=(*entry.files, *_files(projector, root)))
    problem = entry.problem
    if problem is None and _ADAPTER in by_type:
        problem = (
            "Ollama applies a LoRA adapter to this model (its Modelfile's ADAPTER), which Switchyard does "
            "not read from Ollama's store; serve the base model, or give the adapter as a lora setting"
        )
    owner = Owner(
        "ollama",
        root,
        name,
        family=_str(facts.get("model_family")),
        template=_text(by_type.get(_TEMPLATE)),
    )
    return replace(entry, problem=problem, owner=owner, quant=_str(facts.get("file_type")) or entry.quant)


def _files(path: Path, root: Path) -> tuple[FileInfo, ...]:
    got = file_info(path, root, sha256=_sha_of_blob(path))
    return (got,) if got is not None else ()


def _blob(root: Path, digest: object) -> Path | None:
    m = _DIGEST.match(digest) if isinstance(digest, str) else None
    if m is None:
        return None
    blobs = root / "blobs"
    modern, older = blobs / f"sha256-{m.group(1)}", blobs / f"sha256:{m.group(1)}"
    return older if older.exists() and not modern.exists() else modern


def _sha_of_blob(path: Path) -> str | None:
    """A blob is named by the sha256 of its bytes."""
    m = _DIGEST.match(path.name)
    return m.group(1) if m else None


def _json(path: Path | None, cap: int) -> object:
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            raw = f.read(cap + 1)
        return json.loads(raw) if len(raw) <= cap else None
    except (OSError, ValueError):
        return None


def _text(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            return f.read(_TEXT_MAX).decode("utf-8", "replace")
    except OSError:
        return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
