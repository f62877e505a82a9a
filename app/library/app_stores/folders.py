"""The stores that are plain folders of model files: LM Studio (`publisher/repo/file.gguf`, and MLX
folders), Jan (`<model>/model.gguf` beside its model.yml; older versions `<model>/<file>.gguf`), GPT4All
(a flat folder) and the user's shared folders. Read with the models-folder scanner, then named for their
app (`lmstudio:publisher/repo/file`, `jan:<model>`, `gpt4all:<file>`; a shared folder's models keep
their plain names) and marked read-only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.library.app_stores.locations import AppStore
from app.library.model import ModelEntry, Owner
from app.library.sources import ReadGGUF, scan_models_dir

# GPT4All downloads into `incomplete-<name>` and renames when done
_PARTIAL_PREFIXES = ("incomplete-",)


def scan_folder_store(store: AppStore, *, read: ReadGGUF) -> list[ModelEntry]:
    out = []
    for e in scan_models_dir(store.root, read=read, skip=set()):
        if e.path.name.startswith(_PARTIAL_PREFIXES):
            continue
        name = e.path.relative_to(store.root).as_posix()
        out.append(
            replace(
                e,
                id=_model_id(store, e),
                source="app_store",
                owner=Owner(store.app, store.root, name),
            )
        )
    return out


def _model_id(store: AppStore, e: ModelEntry) -> str:
    if store.app == "folder":
        return e.id
    if store.app == "jan" and e.path.is_file() and e.path.parent != store.root and _alone(e.path):
        # Jan keeps one model per folder, named by the folder (its file is often just model.gguf)
        return f"jan:{e.path.parent.relative_to(store.root).as_posix()}"
    return f"{store.app}:{e.id}"


def _alone(path: Path) -> bool:
    """Whether `path` is the only model GGUF in its folder (projectors aside)."""
    try:
        others = [p for p in path.parent.glob("*.gguf") if "mmproj" not in p.name.lower()]
    except OSError:
        return False
    return others == [path]
