"""`switchyard rm MODEL`: take a model out of the library, deleting only what Switchyard may delete.

- HF cache (found or downloaded): the model's links in its snapshot, and the blobs no other snapshot of the
  repository uses (huggingface_hub's own delete strategy); an emptied snapshot goes with its refs, and an
  emptied repository folder with it. Other quantizations in the same snapshot are kept.
- copied import: its folder under models/imported.
- linked import: unregistered; the user's file is deleted only with `delete_files`.
- a models folder: the user's own file; refused unless `delete_files` (a scan would find it again anyway).
- an alias (another name for a model, from Ollama's copy or create): only the name.
- the starter model (inside an installed Python package): refused, saying how to hide it.
- another app's store or a shared folder (source `app_store`): refused, always; those files are the
  other app's (or the user's) to remove, and the message says how.

Every path is checked to lie inside the root it belongs to before anything is deleted.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import RemoveRefusedError
from app.library.catalog import Catalog
from app.library.model import ModelEntry, Owner
from app.library.store import Library


@dataclass
class Removal:
    model_id: str
    source: str
    action: str  # "deleted" | "unregistered"
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "source": self.source,
            "action": self.action,
            "deleted": self.deleted,
            "kept": self.kept,
        }


def _real(p: Path) -> Path:
    """`p` with its folders resolved but not its last component (a symlink is removed, not followed)."""
    return Path(os.path.realpath(p.parent)) / p.name


def _inside(p: Path, root: Path) -> bool:
    return _real(p).is_relative_to(Path(os.path.realpath(root))) and _real(p) != Path(os.path.realpath(root))


def _guard(p: Path, root: Path, model_id: str) -> None:
    if not _inside(p, root):
        raise RemoveRefusedError(f"refusing to delete {p} for {model_id!r}: it is not inside {root}")


def remove_model(
    model_id: str, *, catalog: Catalog, library: Library, imported_root: Path, delete_files: bool = False
) -> Removal:
    alias = library.aliases().get(model_id)
    shadowed = alias is not None and (own := catalog.find(model_id)) is not None and own.id == model_id
    if alias is not None and not shadowed:  # another name for a model: only the name goes, not the model
        library.drop_alias(model_id)
        catalog.scan()
        return Removal(model_id, "alias", "unregistered", kept=[alias["target"]])
    entry = catalog.get(model_id, allow_broken=True)
    if entry.starter is not None:  # inside an installed Python package: not the library's to delete
        raise RemoveRefusedError(
            f"{entry.id!r} is the starter model inside the Python package {entry.starter.package}; to hide "
            'it set "starter_model": false in settings.json (the server takes it at its next start), or '
            f"uninstall the package: `.venv/bin/pip uninstall {entry.starter.package}`"
        )
    if entry.owner is not None:
        raise RemoveRefusedError(_owned_elsewhere(entry, entry.owner))
    if entry.source in ("hf_cache", "download"):
        out = Removal(entry.id, entry.source, "deleted", _delete_from_hf_cache(entry, catalog.hf_cache))
    elif entry.source == "import_copy":
        out = Removal(entry.id, entry.source, "deleted")
        if entry.location is not None and entry.location.exists():
            _guard(entry.location, imported_root, entry.id)
            shutil.rmtree(entry.location)
            out.deleted.append(str(entry.location))
            parent = entry.location.parent  # `org/` left empty by `org/name`
            while parent != imported_root and _inside(parent, imported_root) and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
    elif entry.source == "import_link":
        out = Removal(entry.id, entry.source, "deleted" if delete_files else "unregistered")
        if delete_files:
            out.deleted = _delete_user_files(entry, entry.location or entry.path.parent)
        else:
            out.kept = [str(entry.path)]
    else:
        root = entry.location or entry.path.parent
        if not delete_files:
            raise RemoveRefusedError(
                f"{entry.id!r} is your own file {entry.path} in the models folder {root}; Switchyard "
                "does not delete it unless asked: `switchyard rm --delete-files` deletes it, or move it out "
                "of the folder (a scan would list it again otherwise)"
            )
        out = Removal(entry.id, entry.source, "deleted", _delete_user_files(entry, root))
    library.forget(entry.id)
    catalog.scan()
    return out


def _owned_elsewhere(entry: ModelEntry, owner: Owner) -> str:
    how = {
        "ollama": f"`ollama rm {owner.name}`",
        "lmstudio": "LM Studio's My Models page (or `lms rm`)",
        "jan": "Jan's model settings",
        "gpt4all": "GPT4All's Models page",
    }.get(owner.app, f"deleting {entry.path} yourself")
    hide = (
        '"app_stores" in settings.json' if owner.app != "folder" else '"shared_model_dirs" in settings.json'
    )
    return (
        f"{entry.id!r} lives in {owner.store}, which Switchyard reads but never changes; remove it with "
        f"{how} (the next scan drops it), or stop listing that store through {hide}"
    )


def _delete_user_files(entry: ModelEntry, root: Path) -> list[str]:
    done: list[str] = []
    if entry.path.is_dir() and not entry.path.is_symlink():
        if entry.path != root:
            _guard(entry.path, root, entry.id)
        shutil.rmtree(entry.path)
        return [str(entry.path)]
    targets = [root / f.rel for f in entry.files] or [entry.path]
    for p in targets:
        _guard(p, root, entry.id)
    for p in targets:
        if p.exists() or p.is_symlink():
            p.unlink()
            done.append(str(p))
    return done


def _delete_from_hf_cache(entry: ModelEntry, cache_dir: Path | None) -> list[str]:
    snap = entry.location
    if snap is None or cache_dir is None:
        raise RemoveRefusedError(
            f"{entry.id!r} has no snapshot folder recorded; run `switchyard ls` and retry"
        )
    repo_dir = snap.parent.parent
    if not repo_dir.name.startswith("models--") or not _inside(repo_dir, cache_dir):
        raise RemoveRefusedError(f"refusing to delete {snap}: it is not a snapshot inside {cache_dir}")
    links = [snap / f.rel for f in entry.files]
    for p in links:
        _guard(p, snap, entry.id)
    # blobs still used by any other link in any snapshot of this repository are kept
    used: set[Path] = set()
    for dirpath, _dirs, names in os.walk(repo_dir / "snapshots"):
        for n in names:
            p = Path(dirpath) / n
            if p not in links:
                used.add(Path(os.path.realpath(p)))
    blobs = repo_dir / "blobs"
    deleted: list[str] = []
    for link in links:
        blob = Path(os.path.realpath(link))
        if link.is_symlink() or link.exists():
            link.unlink()
            deleted.append(str(link))
        if blob != link and blob not in used and blob.exists() and _inside(blob, blobs):
            blob.unlink()
            deleted.append(str(blob))
    _prune(snap, repo_dir)
    return deleted


def _prune(snap: Path, repo_dir: Path) -> None:
    """Empty folders left in the snapshot go; an empty snapshot takes its refs; an empty repo goes whole."""
    for dirpath, _dirs, _names in sorted(os.walk(snap), key=lambda t: -len(t[0])):
        d = Path(dirpath)
        if d != snap and not any(d.iterdir()):
            d.rmdir()
    if snap.exists() and any(snap.iterdir()):
        return
    shutil.rmtree(snap, ignore_errors=True)
    refs = repo_dir / "refs"
    for ref in refs.rglob("*") if refs.is_dir() else ():
        if ref.is_file() and ref.read_text().strip() == snap.name:
            ref.unlink()
    snapshots = repo_dir / "snapshots"
    if not snapshots.exists() or not any(snapshots.iterdir()):
        shutil.rmtree(repo_dir, ignore_errors=True)
