"""Safetensors model folders read without loading a weight: `config.json` plus the header of every shard.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`), then the data. Only the
length and the JSON are read. Sharded models list their shards in `model.safetensors.index.json`; without an
index every `*.safetensors` in the folder is a shard, except `consolidated.safetensors` when other shards sit
beside it (Mistral repos ship both layouts).

`summarize_headers` works on header dicts already in memory (the hub publishes them), so a remote model and
a local folder give the same `WeightsSummary`. `model_from_metadata` builds a `SafetensorsModel` from a
config dict and header dicts. Nothing here raises for bad input: problems come back as `SafetensorsProblem`.

Parameter counts: `stored_elements` is the product of the shapes (what the hub calls "parameters" per
dtype); `parameter_count` is the model's logical weights: packed quantized tensors are unpacked by their
bits (AWQ/GPTQ `qweight`, compressed-tensors `weight_packed`, MLX uint32 weights, bitsandbytes 4-bit, mxfp4
blocks) and quantization side tensors (scales, zeros, biases, g_idx, absmax, ...) are left out.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.formats.hf_config import (
    ConfigFacts,
    ConfigProblem,
    QuantizationFacts,
    config_facts,
    quantization_facts,
    read_config,
)

__all__ = [
    "ConfigFacts",
    "QuantizationFacts",
    "SafetensorsModel",
    "SafetensorsProblem",
    "WeightsSummary",
    "config_facts",
    "mlx_evidence",
    "model_from_metadata",
    "quantization_facts",
    "read_header",
    "read_safetensors_dir",
    "safetensors_files",
    "summarize_headers",
]

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation refuses larger headers too
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
_AUX_SUFFIXES = (
    ".qzeros",
    ".scales",
    ".g_idx",
    ".biases",
    "weight_scale",
    "weight_scale_inv",
    "weight_zero_point",
    "weight_g_idx",
    "weight_shape",
    "input_scale",
    "weight_global_scale",
    "input_global_scale",
    "output_scale",
    "k_scale",
    "v_scale",
    "activation_scale",
    ".SCB",
    ".weight_format",
    "_scales",
)
_AUX_PARTS = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.")


@dataclass(frozen=True)
class SafetensorsProblem:
    reason: str


@dataclass(frozen=True)
class WeightsSummary:
    tensor_count: int
    total_bytes: int  # tensor data bytes, from data_offsets
    stored_elements: int
    parameter_count: int  # logical weights (see the module docstring)
    elements_by_dtype: tuple[tuple[str, int], ...]  # largest first
    bytes_by_dtype: tuple[tuple[str, int], ...]
    largest_tensor_bytes: int
    metadata_format: str | None  # __metadata__["format"]: "pt", "mlx", "tf", ... (first header that has one)


@dataclass(frozen=True)
class SafetensorsModel:
    path: Path | None  # the folder; None when built from remote metadata
    config: ConfigFacts
    quantization: QuantizationFacts | None
    weights: WeightsSummary | None  # None only for an MLX folder with weights.npz instead of safetensors
    files: tuple[str, ...]  # shard names
    index_total_size: int | None  # metadata.total_size of the index, as written
    mlx_evidence: str | None  # why this is an MLX model (see detect); None: not MLX


def _mlx_module_bits(q: QuantizationFacts, name: str) -> int | None:
    module = name.rsplit(".", 1)[0]
    for key, bits in q.layer_bits:
        if key == module:
            return bits
    return q.bits


def _logical(name: str, dtype: str, elements: int, q: QuantizationFacts | None) -> int:
    """Logical weights a stored tensor stands for; 0 for quantization side tensors."""
    if q is None:
        return elements
    if name.endswith(_AUX_SUFFIXES) or any(p in name for p in _AUX_PARTS):
        return 0
    bits = q.bits
    if q.method == "mlx" and dtype == "U32":
        bits = _mlx_module_bits(q, name)
        return elements * 32 // bits if bits else elements
    if not bits:
        return elements
    if q.method in ("awq", "gptq") and name.endswith(".qweight"):
        return elements * 32 // bits
    if q.method == "compressed-tensors" and name.endswith(".weight_packed") and dtype in ("I32", "U32"):
        return elements * 32 // bits
    if q.method == "bitsandbytes" and bits == 4 and dtype == "U8" and name.endswith(".weight"):
        return elements * 2
    if q.method == "mxfp4" and name.endswith("_blocks") and dtype == "U8":
        return elements * 2
    return elements


def summarize_headers(
    headers: Iterable[Mapping[str, Any]], *, quantization: QuantizationFacts | None = None
) -> WeightsSummary | SafetensorsProblem:
    """Totals over the header dicts of all shards; a problem names the first malformed tensor entry."""
    count = total = stored = logical = largest = 0
    by_dtype: dict[str, int] = {}
    bytes_dtype: dict[str, int] = {}
    fmt: str | None = None
    for header in headers:
        meta = header.get("__metadata__")
        if fmt is None and isinstance(meta, Mapping) and isinstance(meta.get("format"), str):
            fmt = meta["format"]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            entry = _entry(name, info)
            if isinstance(entry, SafetensorsProblem):
                return entry
            dtype, elements, nbytes = entry
            count += 1
            total += nbytes
            stored += elements
            largest = max(largest, nbytes)
            by_dtype[dtype] = by_dtype.get(dtype, 0) + elements
            bytes_dtype[dtype] = bytes_dtype.get(dtype, 0) + nbytes
            logical += _logical(name, dtype, elements, quantization)
    return WeightsSummary(
        tensor_count=count,
        total_bytes=total,
        stored_elements=stored,
        parameter_count=logical,
        elements_by_dtype=tuple(sorted(by_dtype.items(), key=lambda x: (-x[1], x[0]))),
        bytes_by_dtype=tuple(sorted(bytes_dtype.items(), key=lambda x: (-x[1], x[0]))),
        largest_tensor_bytes=largest,
        metadata_format=fmt,
    )


def _entry(name: str, info: Any) -> tuple[str, int, int] | SafetensorsProblem:
    bad = SafetensorsProblem(f"tensor {name!r} has a malformed header entry; download the file again")
    if not isinstance(info, Mapping):
        return bad
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
        return bad
    if len(offsets) != 2 or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in offsets
    ):
        return bad
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return bad
    begin, end = offsets
    elements = math.prod(shape)
    if end < begin:
        return bad
    size = DTYPE_BYTES.get(dtype)
    if size is not None and end - begin != elements * size:
        return SafetensorsProblem(
            f"tensor {name!r} declares {end - begin} bytes but {dtype} {shape} needs {elements * size}; "
            "download the file again"
        )
    return dtype, elements, end - begin


def read_header(path: Path) -> dict[str, Any] | SafetensorsProblem:
    """The JSON header of one safetensors file (8-byte length + JSON only; checks the data fits the file)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if size == 0:
                return SafetensorsProblem(f"{path.name} is empty; download it again")
            if len(head) < 8:
                return SafetensorsProblem(f"{path.name} is truncated ({size} bytes); download it again")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n + 8 > size:
                return SafetensorsProblem(
                    f"{path.name} is not a safetensors file or is truncated (header length {n}, file size "
                    f"{size}); download it again"
                )
            raw = fh.read(n)
    except OSError as exc:
        return SafetensorsProblem(f"cannot read {path.name}: {exc.strerror or exc}")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return SafetensorsProblem(f"the header of {path.name} is not valid JSON; download it again")
    if not isinstance(header, dict):
        return SafetensorsProblem(f"the header of {path.name} is not a JSON object; download it again")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entry = _entry(name, info)
        if isinstance(entry, SafetensorsProblem):
            return SafetensorsProblem(f"{path.name}: {entry.reason}")
        end = max(end, info["data_offsets"][1])
    if 8 + n + end > size:
        return SafetensorsProblem(
            f"{path.name} is truncated: its tensors need {8 + n + end} bytes but the file has {size}; "
            "download it again"
        )
    return header


def safetensors_files(folder: Path) -> tuple[tuple[str, ...], int | None] | SafetensorsProblem:
    """(shard names, index total_size) for a folder; a problem for a broken index or a missing shard."""
    index = folder / INDEX_NAME
    if index.is_file():
        data = read_config(index)
        if isinstance(data, ConfigProblem):
            return SafetensorsProblem(data.reason)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            return SafetensorsProblem(f"{INDEX_NAME} has no weight_map; download it again")
        names = tuple(sorted({str(v) for v in weight_map.values()}))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            return SafetensorsProblem(
                f"{len(missing)} of {len(names)} shards are missing ({', '.join(missing[:3])}); "
                f"download them into {folder}"
            )
        meta = data.get("metadata")
        total = meta.get("total_size") if isinstance(meta, Mapping) else None
        return names, int(total) if isinstance(total, int | float) and not isinstance(total, bool) else None
    names = tuple(sorted(p.name for p in folder.glob("*.safetensors") if p.is_file()))
    if len(names) > 1 and "consolidated.safetensors" in names:
        names = tuple(n for n in names if n != "consolidated.safetensors")
    return names, None


def mlx_evidence(config: Mapping[str, Any], metadata_format: str | None, *, has_npz: bool) -> str | None:
    """Why a folder is an MLX model, or None. The rule, in order: config.json has MLX's `quantization`
    object with `bits`; a safetensors header says `__metadata__.format == "mlx"` (mlx-lm writes it for
    quantized and unquantized models alike); the folder has `weights.npz` (older mlx-examples layout)."""
    q = config.get("quantization")
    if isinstance(q, Mapping) and "bits" in q:
        return f"config.json has MLX quantization ({q.get('bits')}-bit, group size {q.get('group_size')})"
    if metadata_format == "mlx":
        return 'the safetensors header says format "mlx"'
    if has_npz:
        return "the folder has weights.npz"
    return None


def model_from_metadata(
    config: Mapping[str, Any],
    headers: Sequence[Mapping[str, Any]],
    *,
    files: Sequence[str] = (),
    index_total_size: int | None = None,
    path: Path | None = None,
    has_npz: bool = False,
) -> SafetensorsModel | SafetensorsProblem:
    """A SafetensorsModel from a config dict and the header dicts of its shards (local or from the hub)."""
    quant = quantization_facts(config)
    weights: WeightsSummary | None = None
    if headers:
        summary = summarize_headers(headers, quantization=quant)
        if isinstance(summary, SafetensorsProblem):
            return summary
        weights = summary
    elif not has_npz:
        return SafetensorsProblem(
            "no safetensors weights were found; download the model's *.safetensors files"
        )
    return SafetensorsModel(
        path=path,
        config=config_facts(config),
        quantization=quant,
        weights=weights,
        files=tuple(files),
        index_total_size=index_total_size,
        mlx_evidence=mlx_evidence(config, weights.metadata_format if weights else None, has_npz=has_npz),
    )


def read_safetensors_dir(folder: Path) -> SafetensorsModel | SafetensorsProblem:
    """Facts of the model in `folder` (config.json + safetensors shards, or an MLX weights.npz)."""
    if not folder.is_dir():
        return SafetensorsProblem(f"{folder} is not a folder; point at the model's folder")
    config = read_config(folder / "config.json")
    if isinstance(config, ConfigProblem):
        return SafetensorsProblem(config.reason)
    listed = safetensors_files(folder)
    if isinstance(listed, SafetensorsProblem):
        return listed
    names, total = listed
    headers: list[dict[str, Any]] = []
    for name in names:
        header = read_header(folder / name)
        if isinstance(header, SafetensorsProblem):
            return header
        headers.append(header)
    return model_from_metadata(
        config,
        headers,
        files=names,
        index_total_size=total,
        path=folder,
        has_npz=(folder / "weights.npz").is_file(),
    )
