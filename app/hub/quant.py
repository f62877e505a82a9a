"""Quantization names in GGUF file names, and a repository's files grouped by quantization.

Hub GGUF repositories name each file after its quantization (`model-Q4_K_M.gguf`,
`model.IQ4_XS.gguf`, `UD-Q4_K_XL/model-UD-Q4_K_XL-00001-of-00002.gguf`); a multi-part model is one
choice made of several files, and `mmproj-*.gguf` vision projectors go with every choice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])"
    r"((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]{1,4}){0,3}|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|FP16|F32|FP32))"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_PART = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


def parse_quant(filename: str) -> str | None:
    """`Q4_K_M` for `org/x/model-q4_k_m.gguf`; None where the name carries no quantization."""
    name = PurePosixPath(filename).name
    m = _PART.match(name)
    stem = m.group("stem") if m else name.rsplit(".", 1)[0]
    found = _QUANT.findall(stem)
    if not found:
        return None
    q = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


def split_part(filename: str) -> tuple[str, int, int] | None:
    """(stem path, index, total) of a multi-part GGUF file name, else None."""
    p = PurePosixPath(filename)
    m = _PART.match(p.name)
    if m is None:
        return None
    stem = str(p.with_name(m.group("stem")))
    return stem, int(m.group("idx")), int(m.group("total"))


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int | None = None
    sha256: str | None = None


@dataclass
class QuantChoice:
    """One thing a user can pick: a quantization, made of one or more files."""

    name: str  # the quantization, or the file stem when the name has none
    quant: str | None
    files: list[RepoFile] = field(default_factory=list)
    parts_expected: int = 1

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.parts_expected

    @property
    def first(self) -> RepoFile:
        return self.files[0]

    def public(self) -> dict[str, object]:
        return {
            "name": self.name,
            "quant": self.quant,
            "size": self.size,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "parts": self.parts_expected,
            "complete": self.complete,
        }


@dataclass
class GGUFGroups:
    choices: list[QuantChoice]
    projectors: list[RepoFile]


def is_projector(path: str) -> bool:
    return "mmproj" in PurePosixPath(path).name.lower()


def group_gguf_files(files: Iterable[RepoFile]) -> GGUFGroups:
    """GGUF files grouped into choices (multi-part as one, in part order), projectors apart.

    Choices are ordered by size, smallest first, unknown sizes last."""
    by_key: dict[str, QuantChoice] = {}
    projectors: list[RepoFile] = []
    parts: dict[str, list[tuple[int, RepoFile]]] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf"):
            continue
        if is_projector(f.path):
            projectors.append(f)
            continue
        split = split_part(f.path)
        key = split[0] if split else f.path.rsplit(".", 1)[0]
        if key not in by_key:
            quant = parse_quant(f.path)
            name = quant or PurePosixPath(key).name
            by_key[key] = QuantChoice(name=name, quant=quant, parts_expected=split[2] if split else 1)
        if split:
            parts.setdefault(key, []).append((split[1], f))
        else:
            by_key[key].files.append(f)
    for key, items in parts.items():
        by_key[key].files = [f for _, f in sorted(items, key=lambda t: t[0])]
    choices = list(by_key.values())
    # two files with the same quant in different folders keep distinct names
    seen: dict[str, int] = {}
    for c in choices:
        seen[c.name] = seen.get(c.name, 0) + 1
    for key, c in by_key.items():
        if seen[c.name] > 1:
            c.name = key
    choices.sort(key=lambda c: (c.size is None, c.size or 0, c.name))
    return GGUFGroups(choices=choices, projectors=sorted(projectors, key=lambda f: f.path))


def pick(groups: GGUFGroups, selector: str) -> QuantChoice | None:
    """The choice a `REPO:SELECTOR` names: a quantization (any case), a choice name or a file path."""
    sel = selector.strip()
    for c in groups.choices:
        if c.quant is not None and c.quant.lower() == sel.lower():
            return c
    for c in groups.choices:
        if c.name.lower() == sel.lower() or any(f.path == sel for f in c.files):
            return c
    return None
