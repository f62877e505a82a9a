"""The MLX lane: `mlx_lm.server` on an MLX (or, on Apple Silicon, a plain safetensors) model folder.

MLX sizes its KV cache as requests come: capacity is "runtime-managed". We report the trained window
from config.json as the ceiling, make up no KV estimate, and show the measured footprint after load
(the process's resident memory). mlx_lm.server reads the hub cache for /v1/models even for a local
folder: HF_HUB_OFFLINE=1 and an existing HF_HUB_CACHE keep it offline and working.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.frozen import module_argv
from app.core.settings import Settings
from app.hardware.build_choice import BuildRule
from app.lanes.engines.kind import EnginePython, engine_process_env
from app.lanes.engines.llamacpp.kind import DEFAULT_SLOT_CTX
from app.lanes.engines.plan import ApiStyle, LaunchPlan, PromptBound, StartContext
from app.lanes.engines.python_kind import PythonEngineKind
from app.lanes.proc import settings_env
from app.library.model import ModelEntry


@dataclass(frozen=True)
class MLXParams:
    model_path: str
    served_name: str
    trained_context: int | None  # the ceiling; MLX itself grows its cache up to what memory allows
    extra_args: tuple[str, ...]


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def prompt_cache_args(settings: Settings) -> tuple[str, ...]:
    """mlx-lm's prompt cache, sized by the settings (nothing passed where they leave its default)."""
    args: tuple[str, ...] = ()
    if settings.mlx.mlx_prompt_cache_size:
        args += ("--prompt-cache-size", str(settings.mlx.mlx_prompt_cache_size))
    if settings.mlx.mlx_prompt_cache_mib:
        args += ("--prompt-cache-bytes", str(settings.mlx.mlx_prompt_cache_mib * 1024 * 1024))
    return args


def trained_context(folder: Path) -> int | None:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return int(value) if isinstance(value, int) else None


@dataclass(frozen=True, kw_only=True)
class MLXKind(PythonEngineKind):
    """MLX runs its own server (mlx_lm.server), not a worker of ours."""

    def launch(
        self, entry: ModelEntry, settings: Settings, start: StartContext, *, engine: EnginePython | None
    ) -> LaunchPlan:
        return mlx_plan(entry, settings, ppid=start.ppid, free_port=start.port, engine=engine)

    def window(self, plan: LaunchPlan | None, entry: Callable[[], ModelEntry | None]) -> int | None:
        """MLX grows its cache as requests come: the trained window is the bound (0: not known)."""
        if plan is not None:
            return getattr(plan.params, "trained_context", None) or 0
        model = entry()
        return (trained_context(model.path) if model is not None else None) or 0


_APPLE = apple_silicon()  # plain safetensors run on MLX only on Apple Silicon, where the Metal build is
MLX = MLXKind(
    lane="mlx",
    title="MLX",
    runtime="mlx-lm",
    module="mlx_lm",
    requires=(("mlx", "mlx"),),
    hint=(
        "switchyard engine install mlx (or pip install mlx-lm)"
        if _APPLE
        else "switchyard engine install mlx (or pip install 'mlx[cpu]' mlx-lm; Linux, glibc 2.35+)"
    ),
    formats=frozenset({"mlx", "safetensors"}) if _APPLE else frozenset({"mlx"}),
    offers=frozenset({"chat", "completions"}),
    memory="runtime-managed",
    setting_keys=("mlx_extra_args", "mlx_prompt_cache_size", "mlx_prompt_cache_mib"),
    install_estimate_s=120,
    # Metal on Apple Silicon; MLX's CUDA builds are Linux wheels only
    build_rule=BuildRule(
        name="MLX",
        builds=frozenset({"metal", "cuda12", "cuda13"}),
        linux_only=frozenset({"cuda12", "cuda13"}),
    ),
)


def model_link(folder: Path, model_id: str, *, root: Path) -> Path:
    """`root/<model_id>`, a symlink to the model's folder (replaced if it points elsewhere)."""
    link = root / model_id
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and link.resolve() != folder.resolve():
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(folder.resolve(), target_is_directory=True)
    return link


def mlx_plan(
    entry: ModelEntry,
    settings: Settings,
    *,
    ppid: int,
    free_port: int,
    engine: EnginePython | None = None,
) -> LaunchPlan:
    """The command for an MLX folder (the install check is the kind's).

    mlx_lm.server treats a request's `model` as a model to load (a local path, else a hub repository) unless
    it is the name it was started with. So it is started with our model id as a relative path, in a folder
    where that path is a link to the model: requests that name the model by its id (from every surface:
    OpenAI, Anthropic, Ollama) use the loaded model, and answers carry the id back."""
    folder = entry.path
    extra = tuple(shlex.split(settings.mlx.mlx_extra_args))
    params = MLXParams(str(folder), entry.id, trained_context(folder), extra)
    root = (
        Path(tempfile.gettempdir()) / f"switchyard-mlx-{ppid}"
    )  # one per server: ids may differ between them
    model_link(folder, entry.id, root=root)
    hub = root / ".hub-cache"  # must exist, or /v1/models fails; offline, nothing is fetched into it
    hub.mkdir(parents=True, exist_ok=True)
    argv = (
        *module_argv("app.lanes.guard"),
        str(ppid),
        "--",
        engine.python if engine and engine.managed else sys.executable,
        "-m",
        "mlx_lm.server",
        "--model",
        entry.id,
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port),
        *prompt_cache_args(settings),
        *extra,
    )
    env = engine_process_env(settings_env(settings, kind="mlx"), engine, worker=False)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "PYTHONUNBUFFERED": "1"})
    return LaunchPlan(
        runtime="mlx-lm",
        argv=argv,
        env=env,
        health_path="/health",
        port=free_port,
        params=params,
        engine="mlx",
        api=ApiStyle.OPENAI,
        memory="runtime-managed",
        cwd=str(root),
        # mlx_lm.server would take any prompt: bounded by the trained window (else the configured default)
        prompt_bound=PromptBound(
            tokens=params.trained_context or settings.models.ctx_size or DEFAULT_SLOT_CTX,
            tokenizer=str(Path(folder) / "tokenizer.json"),
        ),
    )
