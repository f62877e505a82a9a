"""What every engine kind hands the Lane: the command to start one engine process and what it will do.

A LaunchPlan is the same for every kind; only its `params` (a dataclass with at least `model_path`) differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.fit.plan import FitReport
from app.hardware.model import Hardware


class ApiStyle(StrEnum):
    """The HTTP API an engine speaks, which decides what the gateway and the lane may ask of it."""

    # llama.cpp's server: /slots (the session bank), /props, timings, its own tool-call parser, and
    # buffer sizes in its load log (the measured footprint)
    LLAMA_SERVER = "llama-server"
    OPENAI = "openai"  # OpenAI's routes only (an engine's own server, or a worker of ours)


class DraftKind(StrEnum):
    """What a kind drafts speculative tokens with, which decides what is paired with a model at its start."""

    DRAFT_MODEL = "draft-model"  # a small model of the same vocabulary (llama.cpp's -md)
    MTP = "mtp"  # an MTP assistant made for one target model (mistral.rs)
    NONE = "none"


@dataclass(frozen=True, kw_only=True)
class StartContext:
    """What every kind's `build` gets besides the model and the settings: one value per start."""

    ppid: int  # the process the engine must not outlive (the guard and our workers watch it)
    port: int  # a free port on 127.0.0.1, for engines that take one (our workers report their own)
    hardware: Hardware | None  # None: unknown, no memory plan
    used: Mapping[str, int] | None = None  # bytes per GPU other lanes were planned to take


@dataclass(frozen=True)
class PromptBound:
    """The most tokens a request may hold, counted with this tokenizer.json (the gateway's preflight)."""

    tokens: int
    tokenizer: str


# What a lane can be asked to do, named as the 400 for a missing one names it.
CAPABILITIES = (
    "chat",
    "completions",
    "embeddings",
    "rerank",
    "transcription",
    "translation",
    "speech",
    "images",
    "tools",
    "vision",
)
# memory semantics: "planned" (our estimate, checked against the engine's load log), "fraction" (the engine
# takes the share of the card we give it), "runtime-managed" (the engine sizes its caches as it goes: only
# the measured footprint after load is real), "fixed" (small models whose footprint is their files)
MEMORY_KINDS = ("planned", "fraction", "runtime-managed", "fixed")


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start one engine process; every field by name (ten of them, several alike)."""

    runtime: str
    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str
    port: int | None  # None: the process reports its port on stdout
    params: Any  # a dataclass with `model_path`
    fit: FitReport | None = None
    engine: str = "llama.cpp"  # the lane id (app/lanes/engines/facts.py)
    api: ApiStyle = ApiStyle.LLAMA_SERVER  # the kind's api_style, for the lane and the session bank
    memory: str = "planned"
    prediction: dict[str, Any] | None = None  # for kinds whose plan is not a FitReport (a GPU share)
    notes: tuple[str, ...] = field(default=())
    cwd: str | None = None  # the engine's working directory; None: the server's
    # what the gateway bounds a prompt by itself, for engines that would take any (MLX): None for the rest
    prompt_bound: PromptBound | None = None

    @property
    def llama_server(self) -> bool:
        """Whether the engine speaks llama-server's API (slots, /props, timings, buffer lines in its log)."""
        return self.api is ApiStyle.LLAMA_SERVER

    def public(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "engine": self.engine,
            "argv": list(self.argv),
            "params": dataclasses.asdict(self.params),
            "memory": self.memory,
        }

    def predicted(self) -> dict[str, Any] | None:
        if self.prediction is not None:
            return self.prediction
        if self.fit is None or self.fit.chosen is None:
            return None
        devices = self.fit.chosen.devices
        return {
            "placement": self.fit.chosen.name,
            "devices": [d.public() for d in devices],
            "total": sum(d.total for d in devices),
        }
