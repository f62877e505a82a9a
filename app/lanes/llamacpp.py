"""The llama.cpp lane: parameters from the model and settings, and the command that runs them.

Two runtimes serve the same HTTP API: `xllamacpp` (the PyPI wheel, hosted in our worker
process) and a `llama-server` binary found on PATH or configured.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.cpu import usable_cores
from app.library.catalog import ModelEntry

DEFAULT_SLOT_CTX = 4096


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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LlamaParams:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one engine process."""

    runtime: str
    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str
    port: int | None  # None: the process reports its port on stdout
    params: LlamaParams

    def public(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "argv": list(self.argv), "params": dataclasses.asdict(self.params)}


def plan_params(entry: ModelEntry, settings: Settings) -> LlamaParams:
    assert entry.facts is not None
    facts = entry.facts
    mid = entry.id
    parallel = int(settings.override(mid, "parallel", settings.parallel))
    trained = facts.context_length or DEFAULT_SLOT_CTX
    ctx = int(settings.override(mid, "ctx_size", settings.ctx_size))
    if ctx == 0:
        # automatic: each slot gets the trained window, capped so the KV cache stays modest
        ctx = min(trained, DEFAULT_SLOT_CTX) * parallel
    threads = settings.threads or usable_cores()
    return LlamaParams(
        model_path=str(entry.path),
        alias=mid,
        ctx_size=ctx,
        parallel=parallel,
        threads=threads,
        kv_type=str(settings.override(mid, "kv_type", settings.kv_type)),
        flash_attn=str(settings.override(mid, "flash_attn", settings.flash_attn)),
        gpu_layers=int(settings.override(mid, "gpu_layers", settings.gpu_layers)),
        embedding=facts.is_embedding,
        pooling=facts.pooling_type if facts.is_embedding else None,
    )


def find_llama_server(settings: Settings) -> str | None:
    if settings.llama_server_path:
        p = Path(settings.llama_server_path).expanduser()
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which("llama-server")


def xllamacpp_available() -> bool:
    return importlib.util.find_spec("xllamacpp") is not None


def choose_runtime(settings: Settings) -> str:
    """The runtime a llama.cpp lane will use, or EngineUnavailableError saying what to install."""
    if settings.runtime in ("auto", "xllamacpp") and xllamacpp_available():
        return "xllamacpp"
    if settings.runtime in ("auto", "llama-server") and find_llama_server(settings):
        return "llama-server"
    if settings.runtime == "llama-server" or settings.llama_server_path:
        where = f"at {settings.llama_server_path}" if settings.llama_server_path else "on PATH"
        lead = (
            "runtime 'llama-server' is selected but"
            if settings.runtime == "llama-server"
            else ("xllamacpp is not installed and")
        )
        raise EngineUnavailableError(
            f"{lead} no executable llama-server was found {where}; install llama.cpp or fix llama_server_path"
        )
    raise EngineUnavailableError(
        "no llama.cpp runtime is installed: `pip install xllamacpp` or put llama-server on PATH"
    )


def worker_argv(params: LlamaParams, *, ppid: int) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "app.lanes.llamacpp_worker",
        "--ppid",
        str(ppid),
        "--params",
        params.to_json(),
    )


def llama_server_argv(binary: str, params: LlamaParams, *, port: int, ppid: int) -> tuple[str, ...]:
    args = [
        sys.executable,
        "-m",
        "app.lanes.guard",
        str(ppid),
        "--",
        binary,
        "--model",
        params.model_path,
        "--alias",
        params.alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(params.ctx_size),
        "--parallel",
        str(params.parallel),
        "--threads",
        str(params.threads),
        "--cache-type-k",
        params.kv_type,
        "--cache-type-v",
        params.kv_type,
        "--flash-attn",
        params.flash_attn,
        "--slots",
        "--metrics",
    ]
    if params.gpu_layers >= 0:
        args += ["--n-gpu-layers", str(params.gpu_layers)]
    if params.embedding:
        args += ["--embedding", "--pooling", params.pooling or "mean"]
    return tuple(args)


def build_plan(entry: ModelEntry, settings: Settings, *, ppid: int, free_port: int) -> LaunchPlan:
    params = plan_params(entry, settings)
    runtime = choose_runtime(settings)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if runtime == "xllamacpp":
        return LaunchPlan(runtime, worker_argv(params, ppid=ppid), env, "/health", None, params)
    binary = find_llama_server(settings)
    assert binary is not None
    argv = llama_server_argv(binary, params, port=free_port, ppid=ppid)
    return LaunchPlan(runtime, argv, env, "/health", free_port, params)
