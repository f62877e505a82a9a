"""The parameters our lane workers are started with, as JSON on their command line.

They live apart from the kind modules on purpose: a worker may run under an engine's own virtual
environment (app/lanes/engine_store.py), which holds the engine and aiohttp but none of Switchyard's
other dependencies (gguf, huggingface_hub ...). So a worker imports only this module, the standard
library, and the few light `app.lanes` modules named in app/lanes/engines.toml; never a kind module.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaParams:
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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LlamaParams:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class PiperParams:
    model_path: str
    config_path: str
    alias: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PiperParams:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class WhisperParams:
    model_path: str
    alias: str
    threads: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WhisperParams:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class MistralRsParams:
    model_path: str  # the GGUF file (its first part) or the model folder
    alias: str
    source: str  # "gguf" (Which.GGUF) or "plain" (Which.Plain: a Hugging Face folder)
    files: tuple[str, ...]  # the GGUF file names (every part) in model_path's folder; () for a folder
    max_seqs: int  # sequences the engine batches at once

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MistralRsParams:
        data = json.loads(text)
        return cls(**{**data, "files": tuple(data.get("files") or ())})
