"""`switchyard import PATH [--link] [--name ID]`: bring a local model file or folder into the library.

The path is checked with app.formats.detect first and refused with the reason when it is not a model.
By default the model is copied into SWITCHYARD_HOME/models/imported/<id>/ (through a hidden temporary folder
renamed into place, so a crash never leaves half a model where a model is expected), hashing each file
on the way (sha256); `--link` registers it where it is and never moves or changes it.

Only regular files are read: a pipe, socket or device is refused (reading one would hang or never end),
and in a folder a symlink must point inside it (or, for a Hugging Face cache snapshot, inside its
repository's folder, where its blobs are), so an import never copies in a file from elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import uuid
from dataclasses import replace
from pathlib import Path

from app.core.errors import ImportRefusedError, ModelNotFoundError
from app.core.names import check_named
from app.formats.detect import ModelKind, detect_format
from app.library.catalog import Catalog
from app.library.model import ModelEntry
from app.library.sources import import_entry
from app.library.store import Library

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_CHUNK = 1 << 20


def check_id(model_id: str) -> str:
    """A library id: `name` or `org/name`, letters, digits, `.`, `_`, `-`; never `..`, `/x` or `x:y`."""
    return check_named(
        model_id,
        fits=len(model_id) <= 200
        and _ID.match(model_id) is not None
        and not any(s in ("..", ".") for s in model_id.split("/")),
        refusal=f"{model_id!r} is not a usable model id: use letters, digits, '.', '_' and '-', with '/' "
        "between parts (like 'my-model' or 'org/my-model'); no '..', no leading '/', no ':'",
        error=ImportRefusedError,
    )


def _default_id(src: Path) -> str:
    name = src.name if src.is_dir() else src.stem
    m = re.match(r"^(?P<stem>.+)-\d{5}-of-\d{5}$", name)
    stem = m["stem"] if m else name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "model"


def _not_regular(path: Path) -> ImportRefusedError:
    return ImportRefusedError(
        f"{path} is not a regular file (a pipe, socket, device or dangling link); a model is made of "
        "regular files: import the folder without it",
        param="path",
    )


def _link_root(src: Path) -> Path:
    """Where symlinks in folder `src` may point: inside it, or for a Hugging Face cache snapshot
    (`models--org--name/snapshots/<commit>`) inside the repository's folder."""
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith("models--"):
        return src.parent.parent
    return src


def _check_entry(path: Path, *, root: Path, src: Path) -> None:
    """A folder entry is a regular file, a folder, or a symlink to one of those inside `root`."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(root):
            raise ImportRefusedError(
                f"{path} is a symlink to {target}, outside {src}: an import does not bring in files from "
                "elsewhere. Copy that file into the folder, or import it by itself",
                param="path",
            )
        try:
            st = target.stat()
        except OSError:
            raise _not_regular(path) from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise _not_regular(path)


def check_tree(src: Path) -> None:
    """Refuse what an import must not read (see the module docstring); `src` is resolved."""
    if not src.is_dir():
        if not src.is_file():
            raise _not_regular(src)
        return
    root = _link_root(src)
    for d, dirs, names in os.walk(src):
        for n in (*dirs, *names):
            _check_entry(Path(d) / n, root=root, src=src)


def _open_regular(src: Path) -> int:
    """A read descriptor, checked to be a regular file once open (no race with a swapped-in pipe)."""
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_regular(src)
    return fd


def _copy_hashed(src: Path, dest: Path) -> str:
    h = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(_open_regular(src), "rb") as fi, dest.open("wb") as fo:
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
    check_tree(src)  # before detection, which opens the files it finds
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
                shas[p.name] = _copy_hashed(p, tmp / p.name)  # a companion that is no regular file: refused
            main = dest / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)  # the model appears whole or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entry = import_entry(model_id, dest, main, source="import_copy", read=catalog.header)
    return replace(entry, files=tuple(replace(f, sha256=shas.get(f.rel)) for f in entry.files))
