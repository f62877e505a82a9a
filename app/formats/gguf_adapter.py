"""LoRA adapter GGUFs (`general.type = adapter`): what they adapt, and whether a base model can take them.

llama.cpp loads an adapter beside its base when the architectures match and, for every adapted weight
`W` ([in, out] in ggml order), the pair `W.lora_a` is [in, rank] and `W.lora_b` is [rank, out].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

from app.formats.gguf_meta import split_part

ADAPTER_NOTE = (
    "a LoRA adapter, not a model: load it with its base model through model_overrides[<base id>].lora "
    '(e.g. [{"file": "<this file>", "scale": 1.0}])'
)


@dataclass(frozen=True)
class AdapterFacts:
    architecture: str | None
    adapter_type: str | None  # "lora" (llama.cpp also knows "alora")
    alpha: float | None
    rank: int | None
    # base weight name -> (in, out) the adapter expects of it, in ggml order
    targets: dict[str, tuple[int, int]]
    file_bytes: int


def _text(reader: gguf.GGUFReader, key: str) -> str | None:
    f = reader.fields.get(key)
    return bytes(f.parts[f.data[0]]).decode("utf-8", "replace") if f is not None and f.data else None


def read_adapter(path: Path) -> AdapterFacts | None:
    """The adapter's facts, or None for a GGUF that is not an adapter (or a file that cannot be read)."""
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception:  # not a GGUF, or corrupt: the model scan reports it
        return None
    if _text(reader, "general.type") != "adapter":
        return None
    alpha_field = reader.fields.get("adapter.lora.alpha")
    alpha = float(alpha_field.parts[alpha_field.data[0]][0]) if alpha_field is not None else None
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    targets: dict[str, tuple[int, int]] = {}
    rank = None
    for name, a in shapes.items():
        if not name.endswith(".lora_a") or len(a) != 2:
            continue
        b = shapes.get(name[: -len("_a")] + "_b")
        if b is None or len(b) != 2:
            continue
        targets[name[: -len(".lora_a")]] = (a[0], b[1])
        rank = a[1]
    return AdapterFacts(
        architecture=_text(reader, "general.architecture"),
        adapter_type=_text(reader, "adapter.type"),
        alpha=alpha,
        rank=rank,
        targets=targets,
        file_bytes=path.stat().st_size,
    )


def adapter_refusal(adapter: AdapterFacts, base: Path) -> str | None:
    """Why llama.cpp would refuse `adapter` on the model at `base`, or None when it fits."""
    try:
        reader = gguf.GGUFReader(str(base), "r")
    except Exception:
        return "the base model's header cannot be read"
    arch = _text(reader, "general.architecture")
    if adapter.architecture != arch:
        return f"the adapter is for architecture {adapter.architecture!r}, the model is {arch!r}"
    if not adapter.targets:
        return "the adapter holds no lora_a/lora_b pairs"
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    split = split_part(base) is not None
    for name, (n_in, n_out) in sorted(adapter.targets.items()):
        have = shapes.get(name)
        if have is None and split:
            continue  # in another part of a split model: its shape is llama.cpp's to check
        if have is None:
            return f"the model has no weight {name} (the adapter was made for another model)"
        if len(have) != 2 or have != (n_in, n_out):
            return f"{name} is {list(have)} in the model but the adapter expects {[n_in, n_out]}"
    return None
