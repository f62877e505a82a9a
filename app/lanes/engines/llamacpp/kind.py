"""The llama.cpp lane: parameters from the model and settings, and the command that runs them.

Two runtimes serve the same HTTP API: `xllamacpp` (the PyPI wheel, hosted in our worker
process) and a `llama-server` binary found on PATH or configured.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from app.core.errors import EngineUnavailableError, ModelBrokenError, ModelTooLargeError
from app.core.frozen import module_argv
from app.core.paths import Paths
from app.core.settings import Settings
from app.fit.memory import MIB, FitParams
from app.fit.plan import Budget, FitReport, plan_placements
from app.fit.projector import projector_memory
from app.formats.gguf_layout import read_gguf_layout
from app.formats.gguf_meta import GGUFProblem
from app.hardware.build_choice import BUILDS, BuildRule
from app.hardware.cpu import usable_cores
from app.hardware.model import Hardware
from app.lanes.bank.sessions import bank_enabled, slots_dir
from app.lanes.engines.kind import EnginePython, engine_process_env, engine_python, plan_window
from app.lanes.engines.kind import worker_argv as kind_worker_argv
from app.lanes.engines.llamacpp.spec import extra_memory, spec_argv, spec_params
from app.lanes.engines.plan import ApiStyle, DraftKind, LaunchPlan, StartContext
from app.lanes.proc import settings_env
from app.lanes.residency import Footprint
from app.lanes.workers.params import LlamaParams
from app.library.catalog import ModelEntry
from app.library.pairing import vision_projector
from app.routing.model import LaneInstall

DEFAULT_SLOT_CTX = 4096  # per slot, where the trained window is unknown or no memory plan cuts it
# a header value drives memory before anything measures it: no published model trains past 10M tokens, so
# a larger trained window is a corrupt or hostile header (2^32-1 once planned a 41M-token context)
MAX_TRAINED_CTX = 1 << 24
MAX_AUTO_SLOT_CTX = 1 << 20  # the automatic window per slot; a longer one only when ctx_size says so


def requested_ctx(entry: ModelEntry, settings: Settings) -> tuple[int, bool]:
    """(total context, whether it was chosen automatically).

    Automatic: every slot asks for the trained window; the memory plan (plan_placements with ctx_is_auto)
    cuts that to the most whose KV cache fits beside the weights, in whole pages per slot, so each of the
    `parallel` slots holds exactly total // parallel tokens, which the gateway's preflight counts against."""
    assert entry.facts is not None
    parallel = int(settings.override(entry.id, "parallel", settings.models.parallel))
    ctx = int(settings.override(entry.id, "ctx_size", settings.models.ctx_size))
    if ctx:
        return ctx, False
    trained = entry.facts.context_length
    if trained is not None and trained > MAX_TRAINED_CTX:
        raise ModelBrokenError(
            f"model {entry.id!r} declares a trained context of {trained} tokens in its header, more than any "
            f"model has ({MAX_TRAINED_CTX} at most): the header is corrupt; set "
            f"model_overrides[{entry.id!r}].ctx_size to start it with a context you choose"
        )
    return min(trained or DEFAULT_SLOT_CTX, MAX_AUTO_SLOT_CTX) * parallel, True


def unplanned_ctx(entry: ModelEntry, settings: Settings) -> int:
    """The context a start without a memory plan takes: an explicit one, else the trained window capped
    at DEFAULT_SLOT_CTX per slot (nothing measured what a longer one would cost)."""
    ctx, auto = requested_ctx(entry, settings)
    if not auto:
        return ctx
    parallel = int(settings.override(entry.id, "parallel", settings.models.parallel))
    return min(ctx // parallel, DEFAULT_SLOT_CTX) * parallel


def fit_params(entry: ModelEntry, settings: Settings) -> FitParams:
    mid = entry.id
    try:
        vision = vision_projector(entry, settings)
    except ModelBrokenError:
        vision = None  # the start says why; the plan counts what would load
    pm = projector_memory(vision[1]) if vision else None
    params = FitParams(
        projector_bytes=pm.weights if pm else 0,
        projector_compute_bytes=pm.compute if pm else 0,
        ctx_size=requested_ctx(entry, settings)[0],
        parallel=int(settings.override(mid, "parallel", settings.models.parallel)),
        kv_type=str(settings.override(mid, "kv_type", settings.models.kv_type)),
        flash_attn=str(settings.override(mid, "flash_attn", settings.models.flash_attn)) != "off",
        prompt_cache_bytes=settings.models.prompt_cache_mib * MIB,
    )
    if (batch := pooled_batch(entry, ctx_size=params.ctx_size, parallel=params.parallel)) > 0:
        params = dataclasses.replace(params, n_ubatch=batch)  # its compute buffer grows with the batch
    return extra_memory(entry, settings, params=params)  # a draft model and LoRA adapters, when set


# llama.cpp's default physical batch: an embedding input longer than this was refused ("increase the
# physical batch size") however large the context
DEFAULT_UBATCH = 512


def pooled_batch(entry: ModelEntry, *, ctx_size: int, parallel: int) -> int:
    """The batch an embedding or rerank lane starts with: a whole slot's context, since a pooled input must
    fit one physical batch; 0 for other models (the engine's default)."""
    if entry.facts is None or not entry.facts.is_embedding:
        return 0
    return max(DEFAULT_UBATCH, ctx_size // max(parallel, 1))


def fit_for(
    entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None = None
) -> FitReport | GGUFProblem:
    """The memory plan for this model on this machine with these settings."""
    layout = read_gguf_layout(list(entry.parts) or [entry.path])
    if isinstance(layout, GGUFProblem):
        return layout
    explicit_layers = int(settings.override(entry.id, "gpu_layers", settings.models.gpu_layers))
    try:
        params, auto = fit_params(entry, settings), requested_ctx(entry, settings)[1]
    except ModelBrokenError as exc:  # a header value no machine can plan for: the fit says why
        return GGUFProblem(exc.message)
    return plan_placements(
        layout,
        hardware,
        params=params,
        budget=Budget.of(hardware, used=used),
        ctx_is_auto=auto,
        gpu_layers=None if explicit_layers < 0 else explicit_layers,
    )


def plan_params(entry: ModelEntry, settings: Settings, *, fit: FitReport | None = None) -> LlamaParams:
    assert entry.facts is not None
    facts = entry.facts
    mid = entry.id
    parallel = int(settings.override(mid, "parallel", settings.models.parallel))
    ctx = unplanned_ctx(entry, settings)
    gpu_layers = int(settings.override(mid, "gpu_layers", settings.models.gpu_layers))
    if fit is not None and fit.chosen is not None:  # the plan is what runs
        ctx = fit.chosen.params.ctx_size
        gpu_layers = fit.chosen.gpu_layers
    threads = settings.models.threads or usable_cores()
    vision = None if facts.is_embedding else vision_projector(entry, settings)
    return LlamaParams(
        model_path=str(entry.path),
        alias=mid,
        ctx_size=ctx,
        parallel=parallel,
        threads=threads,
        kv_type=str(settings.override(mid, "kv_type", settings.models.kv_type)),
        flash_attn=str(settings.override(mid, "flash_attn", settings.models.flash_attn)),
        gpu_layers=gpu_layers,
        embedding=facts.is_embedding,
        pooling=facts.pooling_type if facts.is_embedding else None,
        cache_ram_mib=settings.models.prompt_cache_mib,
        slot_save_path=_slot_save_path(entry, settings),
        mmproj_path=str(vision[0]) if vision else "",
        mmproj_use_gpu=gpu_layers != 0,  # the projector goes where the layers go (the same plan)
        batch_size=pooled_batch(entry, ctx_size=ctx, parallel=parallel),
        slot_cap=facts.context_length or 0,
        **spec_params(mid, settings, model_path=entry.path, draft=entry.draft, gpu_layers=gpu_layers),
    )


def _slot_save_path(entry: ModelEntry, settings: Settings) -> str:
    """The session bank's folder for a chat model with banking on, else "" (no /slots save or restore)."""
    assert entry.facts is not None
    if entry.facts.is_embedding or not bank_enabled(entry.id, settings):
        return ""
    return str(slots_dir(Paths.from_env().home)) + os.sep


def find_llama_server(settings: Settings) -> str | None:
    if settings.llamacpp.llama_server_path:
        p = Path(settings.llamacpp.llama_server_path).expanduser()
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which("llama-server")


def xllamacpp() -> EnginePython | None:
    """xllamacpp in its own environment (`switchyard engine install llama.cpp`), else in this interpreter."""
    return engine_python("llama.cpp", "xllamacpp", "xllamacpp")


def xllamacpp_available() -> bool:
    return xllamacpp() is not None


def choose_runtime(settings: Settings) -> str:
    """The runtime a llama.cpp lane will use, or EngineUnavailableError saying what to install."""
    if settings.llamacpp.runtime in ("auto", "xllamacpp") and xllamacpp_available():
        return "xllamacpp"
    if settings.llamacpp.runtime in ("auto", "llama-server") and find_llama_server(settings):
        return "llama-server"
    if settings.llamacpp.runtime == "xllamacpp":
        raise EngineUnavailableError(
            "runtime 'xllamacpp' is selected but it is not installed: pip install xllamacpp"
        )
    if settings.llamacpp.runtime == "llama-server" or settings.llamacpp.llama_server_path:
        where = (
            f"at {settings.llamacpp.llama_server_path}" if settings.llamacpp.llama_server_path else "on PATH"
        )
        lead = (
            "runtime 'llama-server' is selected but"
            if settings.llamacpp.runtime == "llama-server"
            else ("xllamacpp is not installed and")
        )
        raise EngineUnavailableError(
            f"{lead} no executable llama-server was found {where}; install llama.cpp or fix llama_server_path"
        )
    raise EngineUnavailableError(
        "no llama.cpp runtime is installed: `pip install xllamacpp` or put llama-server on PATH"
    )


def worker_argv(params: LlamaParams, *, ppid: int, engine: EnginePython | None = None) -> tuple[str, ...]:
    # the engine's own environment, else `python -m` or the frozen bundle's own program
    return kind_worker_argv("app.lanes.workers.llamacpp", params.to_json(), ppid=ppid, engine=engine)


def llama_server_argv(binary: str, params: LlamaParams, *, port: int, ppid: int) -> tuple[str, ...]:
    args = [
        *module_argv("app.lanes.guard"),
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
        "--cache-ram",
        str(params.cache_ram_mib),
    ]
    if params.slot_save_path:
        args += ["--slot-save-path", params.slot_save_path]
    if params.mmproj_path:
        args += ["--mmproj", params.mmproj_path]
        if not params.mmproj_use_gpu:
            args += ["--no-mmproj-offload"]
    if params.gpu_layers >= 0:
        args += ["--n-gpu-layers", str(params.gpu_layers)]
    args += spec_argv(params)
    if params.batch_size > 0:
        args += ["--batch-size", str(params.batch_size), "--ubatch-size", str(params.batch_size)]
    if params.embedding and params.pooling == "rank":
        args += ["--reranking"]  # embedding mode with rank pooling, and the /v1/rerank route
    elif params.embedding:
        args += ["--embedding", "--pooling", params.pooling or "mean"]
    return tuple(args)


def build_plan(
    entry: ModelEntry, settings: Settings, start: StartContext, *, engine: EnginePython | None = None
) -> LaunchPlan:
    """The command and parameters for this model; refuses a model that does not fit this machine.
    `engine`: the xllamacpp interpreter to run (a capability build, engines/llamacpp/compat.py); default:
    the lane's own."""
    runtime = "xllamacpp" if engine is not None else choose_runtime(settings)
    fit = None
    ppid, free_port = start.ppid, start.port
    if start.hardware is not None:
        report = fit_for(entry, settings, hardware=start.hardware, used=start.used)
        if isinstance(report, FitReport):
            fit = report
            if not report.fits and settings.memory.enforce_fit:
                advice = "; ".join(report.advice) or "free memory by unloading other models"
                raise ModelTooLargeError(
                    f"model {entry.id!r} {report.summary}; to make it fit: {advice} "
                    f"(see `switchyard explain {entry.id}`)"
                )
    params = plan_params(entry, settings, fit=fit)
    env = settings_env(settings, kind="llama.cpp")
    env["PYTHONUNBUFFERED"] = "1"
    if runtime == "xllamacpp":
        engine = engine or xllamacpp()
        env = engine_process_env(env, engine, worker=True)
        argv = worker_argv(params, ppid=ppid, engine=engine)
        return LaunchPlan(
            runtime=runtime, argv=argv, env=env, health_path="/health", port=None, params=params, fit=fit
        )
    binary = find_llama_server(settings)
    assert binary is not None
    argv = llama_server_argv(binary, params, port=free_port, ppid=ppid)
    return LaunchPlan(
        runtime=runtime, argv=argv, env=env, health_path="/health", port=free_port, params=params, fit=fit
    )


def binary_plan(entry: ModelEntry, settings: Settings, binary: str, start: StartContext) -> LaunchPlan:
    """llama-server at `binary` (a release asset, PATH, or a capability build), its shared libraries
    beside it."""
    pinned = settings.replace(runtime="llama-server", llama_server_path=binary)
    plan = build_plan(entry, pinned, start)
    env = dict(plan.env)
    libdir = str(Path(binary).parent)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env[var] = f"{libdir}:{env[var]}" if env.get(var) else libdir
    return dataclasses.replace(plan, env=env)


class LlamaCppKind:
    """llama.cpp as an engine kind: GGUF language, embedding and reranker models, memory planned from the
    header."""

    lane = "llama.cpp"
    formats = frozenset({"gguf"})
    offers = frozenset({"chat", "completions", "tools", "embeddings", "rerank"})
    memory = "planned"
    api_style = ApiStyle.LLAMA_SERVER
    setting_keys: tuple[str, ...] = ("runtime", "llama_server_path")
    draft = DraftKind.DRAFT_MODEL  # a small model of the same vocabulary (engines/llamacpp/spec.py)
    install_estimate_s = 120
    build_rule = BuildRule(name="llama.cpp", builds=frozenset(BUILDS))  # every backend has its build

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        """The memory plan's placement: the chosen one, else (nothing fits now) the CPU plan, the largest
        host need; None for a GGUF whose layout cannot be read (the start says why)."""
        report = fit_for(entry, settings, hardware=hardware, used=used)
        if not isinstance(report, FitReport) or not report.placements:
            return None
        placement = report.chosen or report.placements[-1]
        return Footprint({d.device: d.total for d in placement.devices}, "predicted")

    def window(self, plan: LaunchPlan | None, entry: Callable[[], ModelEntry | None]) -> int | None:
        return plan_window(plan)

    def install(self, settings: Settings) -> LaneInstall:
        try:
            runtime = choose_runtime(settings)  # the choice a lane start makes, `runtime` setting included
        except EngineUnavailableError as exc:
            return LaneInstall(self.lane, False, None, note=exc.message)
        found = xllamacpp()
        if runtime == "xllamacpp" and found is not None:
            note = f"in its own environment, {found.venv}" if found.managed else ""
            return LaneInstall(self.lane, True, f"xllamacpp {found.version}", note=note)
        return LaneInstall(self.lane, True, f"llama-server at {find_llama_server(settings)}")

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install(settings)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        """With `settings`, vision follows the model's `mmproj` override (ModelEntry.projector), as the
        start does; without, the library's pairing alone."""
        if entry.kind == "embedding":
            return frozenset({"embeddings"})
        if entry.kind == "rerank":
            return frozenset({"rerank"})
        vision = {"vision"} if entry.projector(settings) is not None else set()  # it loads with it
        return frozenset({"chat", "completions", "tools", *vision})

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        return build_plan(entry, settings, start)
