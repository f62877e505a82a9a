"""GGUF header facts, read with the `gguf` package (memory-mapped, never loaded into RAM).

A file that is not a usable GGUF yields `GGUFProblem` with a reason a user can act on; reading
never raises for bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from app.formats.head import file_head

MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})$")


@dataclass(frozen=True)
class GGUFFacts:
    architecture: str
    name: str | None
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    pooling_type: str | None  # None: generative; "mean"/"cls"/...: an embedding model; "rank": a reranker
    chat_template: str | None
    file_type: str | None
    tensor_bytes: int
    file_bytes: int

    @property
    def is_embedding(self) -> bool:
        """Pools its hidden states (an embedding model or a reranker): llama.cpp runs it in embedding mode."""
        return self.pooling_type not in (None, "none", "unspecified")

    @property
    def is_reranker(self) -> bool:
        """Rank pooling: it scores (query, document) pairs through a classifier head, for /v1/rerank."""
        return self.pooling_type == "rank"

    def public(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "name": self.name,
            "context_length": self.context_length,
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "pooling_type": self.pooling_type,
            "has_chat_template": self.chat_template is not None,
            "file_type": self.file_type,
            "tensor_bytes": self.tensor_bytes,
            "file_bytes": self.file_bytes,
        }


@dataclass(frozen=True)
class GGUFProblem:
    reason: str


def split_part(path: Path) -> tuple[str, int, int] | None:
    """(stem, index, total) for a multi-part name like `m-00001-of-00003.gguf`, else None."""
    m = _SPLIT_RE.match(path.stem)
    if not m:
        return None
    return m["stem"], int(m["idx"]), int(m["total"])


def _scalar(fields: Any, key: str) -> Any:
    f = fields.get(key)
    if f is None:
        return None
    value = f.contents()
    if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv): report the largest
        nums = [v for v in value if isinstance(v, int | float)]
        return max(nums) if nums else None
    return value


def _enum_name(enum: Any, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return str(enum(int(value)).name).lower()
    except (ValueError, TypeError):
        return f"unknown({value})"


def open_reader(path: Path, *, named: str, not_gguf: str) -> tuple[int, Any] | GGUFProblem:
    """`path`'s size and a memory-mapped gguf.GGUFReader over it, or why there is none: unreadable, empty,
    not a GGUF (`not_gguf` says what to do then), or a corrupt header. Messages call the file `named`."""
    read = file_head(path, 4, named=named)
    if isinstance(read, str):
        return GGUFProblem(read)
    size, head = read
    if head != MAGIC:
        return GGUFProblem(
            f"{named} is not a GGUF file (it starts with {head!r}, a GGUF starts with b'GGUF'); {not_gguf}"
        )
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # the reader raises many kinds for truncated or corrupt data
        return GGUFProblem(
            f"the GGUF header or tensor table of {named} is corrupt or the file is truncated "
            f"({type(exc).__name__}: {exc}); download it again"
        )
    return size, reader


def read_gguf(path: Path) -> GGUFFacts | GGUFProblem:
    opened = open_reader(
        path,
        named="the file",
        not_gguf="remove it from the models folder or replace it with a .gguf model",
    )
    if isinstance(opened, GGUFProblem):
        return opened
    size, reader = opened
    split = split_part(path)
    tensor_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    if split is None and tensor_bytes > size:
        return GGUFProblem(
            f"the file is truncated: its tensors need {tensor_bytes} bytes but the file has {size}; "
            "download it again"
        )
    return facts_from_reader(reader, tensor_bytes=tensor_bytes, file_bytes=size)


def facts_from_reader(reader: Any, *, tensor_bytes: int, file_bytes: int) -> GGUFFacts | GGUFProblem:
    """GGUFFacts from an open `gguf.GGUFReader` (the first part of a multi-part model carries the header).

    `tensor_bytes` and `file_bytes` are passed in so a multi-part reader can report totals over all parts.
    """
    fields = reader.fields
    arch = _scalar(fields, "general.architecture")
    if not isinstance(arch, str):
        return GGUFProblem("the GGUF has no general.architecture key; it is not a model llama.cpp can load")
    ft = _scalar(fields, "general.file_type")
    template = _scalar(fields, "tokenizer.chat_template")
    pooling_raw = _scalar(fields, f"{arch}.pooling_type")
    return GGUFFacts(
        architecture=arch,
        name=_scalar(fields, "general.name"),
        context_length=_scalar(fields, f"{arch}.context_length"),
        block_count=_scalar(fields, f"{arch}.block_count"),
        embedding_length=_scalar(fields, f"{arch}.embedding_length"),
        head_count=_scalar(fields, f"{arch}.attention.head_count"),
        head_count_kv=_scalar(fields, f"{arch}.attention.head_count_kv"),
        pooling_type=_enum_name(gguf.PoolingType, pooling_raw),
        chat_template=template if isinstance(template, str) else None,
        file_type=_enum_name(gguf.LlamaFileType, ft),
        tensor_bytes=tensor_bytes,
        file_bytes=file_bytes,
    )
