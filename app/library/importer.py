"""`switchyard import PATH [--link] [--name ID]`: bring a local model file or folder into the library.

The path is checked with app.formats.detect first and refused with the reason when it is not a model.
By default the model is copied into SWITCHYARD_HOME/models/imported/<id>/ (through a hidden temporary folder
renamed into place, so a crash never leaves half a model where a model is expected), hashing each file
on the way (sha256); `--link` registers it where it is and never moves or changes it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

from app.core.errors import ImportRefusedError, ModelNotFoundError
from app.formats.detect import ModelKind, detect_format
from app.library.catalog import Catalog
from app.library.model import ModelEntry
from app.library.sources import import_entry
from app.library.store import Library

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_CHUNK = 1 << 20


def check_id(model_id: str) -> str:
    """A library id: `name` or `org/name`, letters, digits, `.`, `_`, `-`; never `..`, `/x` or `x:y`."""
    if len(model_id) > 200 or not _ID.match(model_id) or any(s in ("..", ".") for s in model_id.split("/")):
        raise ImportRefusedError(
            f"{model_id!r} is not a usable model id: use letters, digits, '.', '_' and '-', with '/' between "
            "parts (like 'my-model' or 'org/my-model'); no '..', no leading '/', no ':'",
            param="name",
        )
    return model_id


def _default_id(src: Path) -> str:
    name = src.name if src.is_dir() else src.stem
    m = re.match(r"^(?P<stem>.+)-\d{5}-of-\d{5}$", name)
    stem = m["stem"] if m else name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "model"


def _copy_hashed(src: Path, dest: Path) -> str:
    h = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fi, dest.open("wb") as fo:
        while chunk := fi.read(_CHUNK):
            h.update(chunk)
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    shutil.copystat(src, dest)
    return h.hexdigest()


def import_model(
    src: Path,
    *,
    catalog: Catalog,
    library: Library,
    imported_root: Path,
    link: bool = False,
    name: str | None = None,
) -> ModelEntry:
    src = Path(src).expanduser()
    if not src.exists():
        raise ImportRefusedError(f"nothing to import at {src}: no such file or folder", param="path")
    src = src.resolve()
    fmt = detect_format(src)
    if fmt.kind is ModelKind.MMPROJ:
        raise ImportRefusedError(
            f"{src} is a vision projector (mmproj), not a model by itself; import the model it belongs to "
            "(put both in one folder and import the folder)",
            param="path",
        )
    if not fmt.ok:
        why = fmt.problem or "no GGUF, safetensors, MLX, diffusers, whisper or piper model was found there"
        raise ImportRefusedError(f"{src} cannot be imported: {why}", param="path")
    root = imported_root.resolve()
    if not link and src.is_dir() and (root.is_relative_to(src) or src.is_relative_to(root)):
        raise ImportRefusedError(
            f"{src} holds the library's own folder {root} (or lies inside it); import the model's own folder",
            param="path",
        )
    model_id = check_id(name if name is not None else _default_id(src))
    try:
        existing = catalog.get(model_id, allow_broken=True)
    except ModelNotFoundError:
        existing = None
    if existing is not None:
        raise ImportRefusedError(
            f"a model {model_id!r} is already in the library ({existing.source}: {existing.path}); "
            "choose another id with --name",
            param="name",
        )
    if link:
        location = src if src.is_dir() else src.parent
        entry = import_entry(model_id, location, src, source="import_link", read=catalog.header)
    else:
        entry = _copy_in(
            src, fmt.files, fmt.companions, model_id=model_id, root=imported_root, catalog=catalog
        )
    library.register(entry)
    catalog.scan()
    return catalog.get(model_id, allow_broken=True)


def _copy_in(
    src: Path,
    files: tuple[Path, ...],
    companions: tuple[Path, ...],
    *,
    model_id: str,
    root: Path,
    catalog: Catalog,
) -> ModelEntry:
    dest = root / model_id
    if dest.exists():
        raise ImportRefusedError(
            f"{dest} already exists (an earlier import not in the library?); "
            "remove it or choose another --name",
            param="name",
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-import-{uuid.uuid4().hex[:12]}"
    shas: dict[str, str] = {}
    try:
        if src.is_dir():
            listed = [Path(d) / n for d, _dirs, names in os.walk(src) for n in names]  # before writing
            for p in listed:
                rel = p.relative_to(src).as_posix()
                shas[rel] = _copy_hashed(p, tmp / rel)
            main = dest
        else:
            for p in dict.fromkeys((*(files or (src,)), *companions)):
                shas[p.name] = _copy_hashed(p, tmp / p.name)
            main = dest / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)  # the model appears whole or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entry = import_entry(model_id, dest, main, source="import_copy", read=catalog.header)
    return replace(entry, files=tuple(replace(f, sha256=shas.get(f.rel)) for f in entry.files))
