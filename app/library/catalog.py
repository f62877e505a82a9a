"""The first cut of the library: GGUF files found under the models folders.

`DIR/tiny.gguf` has id `tiny`; `DIR/org/repo/file.gguf` has id `org/repo/file`; a multi-part
GGUF (`m-00001-of-00003.gguf`) is one model with the id of its stem `m`. Headers are read once
per (path, size, mtime) and a broken file is listed with its reason, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import ModelBrokenError, ModelNotFoundError
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf, split_part


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: Path
    facts: GGUFFacts | None
    problem: str | None
    parts: tuple[Path, ...] = ()

    @property
    def ok(self) -> bool:
        return self.facts is not None and self.problem is None

    @property
    def kind(self) -> str:
        if self.facts is None:
            return "unknown"
        return "embedding" if self.facts.is_embedding else "chat"

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": str(self.path),
            "format": "gguf",
            "kind": self.kind,
            "status": "ok" if self.ok else "broken",
            "problem": self.problem,
            "parts": [str(p) for p in self.parts] if len(self.parts) > 1 else [],
            "facts": self.facts.public() if self.facts else None,
        }


_Key = tuple[str, int, int]


class Catalog:
    def __init__(self, dirs: Iterable[Path]) -> None:
        self.dirs = tuple(Path(d) for d in dirs)
        self._cache: dict[_Key, GGUFFacts | GGUFProblem] = {}
        self._entries: dict[str, ModelEntry] = {}

    def _read(self, path: Path) -> GGUFFacts | GGUFProblem:
        try:
            st = path.stat()
        except OSError as exc:
            return GGUFProblem(f"cannot read the file: {exc.strerror or exc}")
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._cache:
            self._cache[key] = read_gguf(path)
        return self._cache[key]

    def _scan_dir(self, root: Path) -> Iterable[ModelEntry]:
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() == ".gguf" and p.is_file())
        for path in files:
            if "mmproj" in path.name.lower():
                continue  # vision projectors belong to a model; they are not models themselves
            rel = path.relative_to(root).with_suffix("")
            split = split_part(path)
            parts: tuple[Path, ...] = (path,)
            problem: str | None = None
            if split is not None:
                stem, idx, total = split
                if idx != 1:
                    continue
                rel = rel.with_name(stem)
                parts = tuple(
                    path.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)
                )
                missing = [p.name for p in parts if not p.exists()]
                if missing:
                    problem = f"multi-part model is incomplete: missing {', '.join(missing)}"
            read = self._read(path)
            if isinstance(read, GGUFProblem):
                yield ModelEntry(rel.as_posix(), path, None, read.reason, parts)
            else:
                yield ModelEntry(rel.as_posix(), path, read if problem is None else None, problem, parts)

    def scan(self) -> list[ModelEntry]:
        entries: dict[str, ModelEntry] = {}
        for root in self.dirs:
            if not root.is_dir():
                continue
            for e in self._scan_dir(root):
                if e.id in entries:
                    first = entries[e.id].path
                    e = ModelEntry(e.id, e.path, None, f"duplicate model id; {first} is served instead")
                    entries[f"{e.id}@{e.path}"] = e
                    continue
                entries[e.id] = e
        self._entries = entries
        return list(entries.values())

    def entries(self) -> list[ModelEntry]:
        return self.scan()

    def ids(self) -> list[str]:
        return [e.id for e in self._entries.values() if e.ok]

    def get(self, model_id: str, *, allow_broken: bool = False) -> ModelEntry:
        """The entry for a servable model; rescans once on a miss (a file may have just arrived).

        `allow_broken` returns a broken entry instead of raising (to explain why it is broken)."""
        entry = self._entries.get(model_id)
        if entry is None or not entry.path.exists():
            self.scan()
            entry = self._entries.get(model_id)
        if entry is None:
            known = (
                ", ".join(self.ids()) or "none (put .gguf files in " + ", ".join(map(str, self.dirs)) + ")"
            )
            raise ModelNotFoundError(
                f"model {model_id!r} does not exist; available models: {known}", param="model"
            )
        if not entry.ok and not allow_broken:
            raise ModelBrokenError(f"model {model_id!r} cannot be served: {entry.problem}", param="model")
        return entry
