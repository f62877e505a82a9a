"""Opening the parts of a GGUF model and reading typed header keys, for `gguf_layout`.

Every failure is a `GGUFProblem` (or a `LayoutProblem` raised inside the layout builder and turned into one)
whose reason says what to do; nothing here raises for bad input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from app.formats.gguf_meta import GGUFProblem, open_reader, split_part


class LayoutProblem(Exception):
    """Raised while building a layout from an inconsistent header; caught and returned as a GGUFProblem."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class OpenPart:
    path: Path
    size: int
    reader: Any  # gguf.GGUFReader (memory-mapped)


def open_gguf(path: Path) -> OpenPart | GGUFProblem:
    """Open one GGUF file: checks it is non-empty, starts with b'GGUF', parses, and holds all its tensors."""
    opened = open_reader(path, named=path.name, not_gguf="replace it with a .gguf model")
    if isinstance(opened, GGUFProblem):
        return opened
    size, reader = opened
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        return GGUFProblem(
            f"{path.name} is truncated: its tensors end at byte {end} but the file has {size}; "
            "download it again"
        )
    return OpenPart(path=path, size=size, reader=reader)


def part_paths(path: Path) -> tuple[Path, ...] | GGUFProblem:
    """All parts of the model `path` belongs to, in order; a single file is its own only part."""
    split = split_part(path)
    if split is None:
        return (path,)
    stem, _, total = split
    paths = tuple(path.with_name(f"{stem}-{i:05d}-of-{total:05d}{path.suffix}") for i in range(1, total + 1))
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        return GGUFProblem(
            f"{len(missing)} of {total} parts are missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); download every part into {path.parent}"
        )
    return paths


def open_parts(path: Path | Sequence[Path]) -> list[OpenPart] | GGUFProblem:
    """Open every part; checks the split keys agree (split.no order, split.count, split.tensors.count)."""
    if isinstance(path, Path):
        paths = part_paths(path)
        if isinstance(paths, GGUFProblem):
            return paths
    else:
        paths = tuple(sorted(path, key=lambda p: (split_part(p) or ("", 0, 0))[1]))
        if not paths:
            return GGUFProblem("no GGUF parts were given")
    parts: list[OpenPart] = []
    for p in paths:
        opened = open_gguf(p)
        if isinstance(opened, GGUFProblem):
            return opened
        parts.append(opened)
    count = int_key(parts[0].reader.fields, "split.count")
    if count is None:
        if len(parts) > 1:
            return GGUFProblem(
                f"{parts[0].path.name} has no split.count key but {len(parts)} parts were found"
            )
        return parts
    if count != len(parts):
        return GGUFProblem(
            f"{parts[0].path.name} says the model has {count} parts but {len(parts)} were found; "
            "download every part into the same folder"
        )
    for i, part in enumerate(parts):
        no = int_key(part.reader.fields, "split.no")
        if no is not None and no != i:
            return GGUFProblem(f"{part.path.name} is part {no + 1} but sits at position {i + 1}; rename it")
    want = int_key(parts[0].reader.fields, "split.tensors.count")
    have = sum(len(p.reader.tensors) for p in parts)
    if want is not None and want != have:
        return GGUFProblem(
            f"the parts hold {have} tensors but the first part lists {want}; a part is from another "
            "download, download them again"
        )
    return parts


def _is_array(f: Any) -> bool:
    return bool(f.types) and f.types[0] == gguf.GGUFValueType.ARRAY


def int_key(fields: Any, key: str) -> int | None:
    """An integer scalar key; None when absent, an array, a bool or not a number."""
    f = fields.get(key)
    if f is None or _is_array(f):
        return None
    value = f.contents()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def key_text(fields: Any, key: str) -> str | None:
    f = fields.get(key)
    if f is None or _is_array(f):
        return None
    value = f.contents()
    return value if isinstance(value, str) else None


def int_array(fields: Any, key: str, n: int) -> tuple[int, ...] | None:
    """A per-layer integer key: a scalar repeated `n` times or an array of exactly `n` entries."""
    f = fields.get(key)
    if f is None:
        return None
    if not _is_array(f):
        value = int_key(fields, key)
        return None if value is None else (value,) * n
    values = f.contents()
    if len(values) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise LayoutProblem(
            f"{key} has {len(values)} entries for {n} layers; the header is inconsistent, download it again"
        )
    return tuple(int(v) for v in values)


def bool_array(fields: Any, key: str, n: int) -> tuple[bool, ...] | None:
    """A per-layer bool array key of exactly `n` entries; None when absent or a scalar."""
    f = fields.get(key)
    if f is None or not _is_array(f):
        return None
    values = f.contents()
    if len(values) != n:
        raise LayoutProblem(
            f"{key} has {len(values)} entries for {n} layers; the header is inconsistent, download it again"
        )
    return tuple(bool(v) for v in values)
