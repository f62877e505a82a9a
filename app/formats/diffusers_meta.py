"""Diffusers pipelines: a folder with `model_index.json` naming its components (`"unet": ["diffusers",
"UNet2DConditionModel"]`), each in a sub-folder of the same name.

Weights per component are the tensor bytes from the safetensors headers (file size for `.bin` weights). When
a component ships several variants (`diffusion_pytorch_model.safetensors` and `...fp16.safetensors`) the
default (no variant) set is counted, else the first variant by name; `variant` says which was counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.formats.hf_config import ConfigProblem, read_config
from app.formats.safetensors_meta import SafetensorsProblem, read_header, summarize_headers

INDEX = "model_index.json"
_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}$")


@dataclass(frozen=True)
class DiffusersProblem:
    reason: str


@dataclass(frozen=True)
class DiffusersComponent:
    name: str  # "unet", "vae", "text_encoder", ...
    library: str | None  # "diffusers", "transformers"; None for an optional component left out
    class_name: str | None
    present: bool  # the sub-folder exists
    weight_files: tuple[str, ...]
    variant: str | None  # e.g. "fp16" when only a variant was counted
    weight_bytes: int


@dataclass(frozen=True)
class DiffusersPipeline:
    path: Path
    class_name: str  # "StableDiffusionPipeline", "FluxPipeline", ...
    diffusers_version: str | None
    components: tuple[DiffusersComponent, ...]

    @property
    def weight_bytes(self) -> int:
        return sum(c.weight_bytes for c in self.components)


def _variant(name: str) -> str:
    """ "fp16" for `diffusion_pytorch_model.fp16.safetensors` or `model.fp16-00001-of-00002.safetensors`."""
    base = _SHARD_RE.sub("", name.rsplit(".", 1)[0])
    return base.split(".", 1)[1] if "." in base else ""


def _weights(folder: Path) -> tuple[tuple[str, ...], str | None, int] | DiffusersProblem:
    files = sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())
    use_safetensors = bool(files)
    if not files:
        files = sorted(p.name for p in folder.glob("*.bin") if p.is_file())
    if not files:
        return (), None, 0
    groups: dict[str, list[str]] = {}
    for f in files:
        groups.setdefault(_variant(f), []).append(f)
    variant = "" if "" in groups else sorted(groups)[0]
    chosen = tuple(groups[variant])
    if not use_safetensors:
        return chosen, variant or None, sum((folder / f).stat().st_size for f in chosen)
    headers = []
    for f in chosen:
        header = read_header(folder / f)
        if isinstance(header, SafetensorsProblem):
            return DiffusersProblem(f"{folder.name}/{header.reason}")
        headers.append(header)
    summary = summarize_headers(headers)
    if isinstance(summary, SafetensorsProblem):
        return DiffusersProblem(f"{folder.name}: {summary.reason}")
    return chosen, variant or None, summary.total_bytes


def read_diffusers(folder: Path) -> DiffusersPipeline | DiffusersProblem:
    data = read_config(folder / INDEX)
    if isinstance(data, ConfigProblem):
        return DiffusersProblem(data.reason)
    cls = data.get("_class_name")
    if not isinstance(cls, str):
        return DiffusersProblem(f"{INDEX} has no _class_name; it is not a diffusers pipeline index")
    components: list[DiffusersComponent] = []
    for name, spec in sorted(data.items()):
        if name.startswith("_") or not isinstance(spec, list) or len(spec) != 2:
            continue
        lib, klass = (v if isinstance(v, str) else None for v in spec)
        sub = folder / name
        present = sub.is_dir()
        weights = _weights(sub) if present else ((), None, 0)
        if isinstance(weights, DiffusersProblem):
            return weights
        files, variant, size = weights
        components.append(DiffusersComponent(name, lib, klass, present, files, variant, size))
    version = data.get("_diffusers_version")
    return DiffusersPipeline(
        path=folder,
        class_name=cls,
        diffusers_version=version if isinstance(version, str) else None,
        components=tuple(components),
    )


def is_diffusers_index(data: Mapping[str, object]) -> bool:
    return isinstance(data.get("_class_name"), str) and "_diffusers_version" in data
