"""The parameters our lane workers are started with, as JSON on their command line.

They live apart from the kind modules on purpose: a worker may run under an engine's own virtual
environment (app/lanes/install/store.py), which holds the engine and aiohttp but none of Switchyard's
other dependencies (gguf, huggingface_hub ...). So a worker imports only this module, the standard
library, app.core.errors and the few light `app.lanes` modules named in lanes/install/engines.toml; never a
kind module. Each params class is a frozen dataclass with the JsonParams mixin: one JSON shape, checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Self

from app.core.errors import EngineStartError  # standard library only, like this module


def _checked(name: str, value: Any, hint: Any) -> Any:
    """`value` as the field's type (a JSON list becomes a tuple), or TypeError saying what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _checked(name, value, arm)
            except TypeError:
                continue
    elif origin is tuple and isinstance(value, list | tuple):
        return tuple(_checked(name, item, args[0] if args else Any) for item in value)
    elif hint is Any or (hint is type(None) and value is None):
        return value
    # bool is an int to isinstance: a JSON true is never a count, nor a count a flag
    elif hint in (int, float) and isinstance(value, int | float) and not isinstance(value, bool):
        if hint is float or isinstance(value, int):
            return hint(value)
    elif hint in (str, bool) and isinstance(value, hint):
        return value
    raise TypeError(f"{name} must be {getattr(hint, '__name__', hint)}, not {type(value).__name__}")


def worker_command_line(prog: str, argv: list[str] | None = None) -> tuple[int, str]:
    """(server pid, params JSON) from a worker's `--ppid N --params JSON`, as lanes.engines.kind.worker_argv
    writes it; the JSON is read apart (`XParams.from_json`) so each worker ties itself to the server first."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--ppid", type=int, required=True)
    ap.add_argument("--params", required=True)
    args = ap.parse_args(argv)
    return args.ppid, args.params


class JsonParams:
    """to_json/from_json for a frozen dataclass of JSON scalars, None and tuples, checked field by field."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Self:
        """The params a worker was started with; EngineStartError when they are not this class's shape."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, not {type(data).__name__}")
            hints = typing.get_type_hints(cls)
            fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
            if unknown := sorted(set(data) - fields):
                raise TypeError(f"unknown fields {', '.join(unknown)}")
            return cls(**{k: _checked(k, v, hints[k]) for k, v in data.items()})
        except (ValueError, TypeError) as exc:
            raise EngineStartError(
                f"the {cls.__name__} this worker was started with are not valid ({exc}); the worker and the "
                "server come from different Switchyard versions: restart Switchyard"
            ) from exc


@dataclass(frozen=True)
class LlamaParams(JsonParams):
    model_path: str
    alias: str
    ctx_size: int  # total across slots, as llama.cpp's -c
    parallel: int
    threads: int
    kv_type: str
    flash_attn: str
    gpu_layers: int
    embedding: bool
    pooling: str | None
    cache_ram_mib: int = 512
    slot_save_path: str = ""  # the session bank's folder ("" : no slot save/restore)
    mmproj_path: str = ""  # the vision projector loaded beside the weights ("": none)
    mmproj_use_gpu: bool = False  # the projector on the GPU: only when the placement offloads layers
    # speculative decoding (docs/engines.md#speculative-decoding): llama.cpp's type, lower case without
    # its prefix ("ngram_mod", "draft_simple"; "": off); a negative knob keeps the engine's default
    spec_type: str = ""
    spec_n_max: int = -1
    spec_n_min: int = -1
    spec_p_min: float = -1.0
    spec_size_n: int = -1
    spec_size_m: int = -1
    spec_min_hits: int = -1
    spec_n_match: int = -1
    draft_path: str = ""  # the draft model's GGUF, for "draft_simple"
    draft_gpu_layers: int = -1
    lora_paths: tuple[str, ...] = ()  # LoRA adapters loaded at start, each with its scale
    lora_scales: tuple[float, ...] = ()
    # llama.cpp's logical and physical batch (-b, -ub); 0: the engine's default (512). An embedding or
    # rerank input is pooled from one physical batch, so those lanes get a batch of a whole slot's context
    batch_size: int = 0
    # the trained context: llama.cpp caps each slot at it, whatever ctx_size gives (0: unknown). Not an
    # engine setting: what the gateway checks prompts against and /v1/models shows
    slot_cap: int = 0


@dataclass(frozen=True)
class PiperParams(JsonParams):
    model_path: str
    config_path: str
    alias: str


@dataclass(frozen=True)
class WhisperParams(JsonParams):
    model_path: str
    alias: str
    threads: int


@dataclass(frozen=True)
class MistralRsParams(JsonParams):
    model_path: str  # the GGUF file (its first part) or the model folder
    alias: str
    source: str  # "gguf" (Which.GGUF) or "plain" (Which.Plain: a Hugging Face folder)
    files: tuple[str, ...]  # the GGUF file names (every part) in model_path's folder; () for a folder
    max_seqs: int  # sequences the engine batches at once
