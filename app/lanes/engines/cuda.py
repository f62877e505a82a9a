"""The vLLM and SGLang lanes (NVIDIA GPUs): their command lines, environment and memory share.

The share is planned by app/fit/gpu_share.py with the rule each kind declares here (`share`, below): the
memory flag (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static) is derived from the plan so two
GPU lanes can share one card; the context length, the batch and sequence limits and the KV dtype are
pinned to what the plan assumed. Tensor parallel spans as many NVIDIA cards as the model's attention and
KV heads allow. Nothing here runs without a CUDA GPU: bench/gpu_check.py starts both for real where one
is present.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import EngineUnavailableError
from app.core.frozen import module_argv
from app.core.paths import Paths
from app.core.settings import Settings
from app.fit.gpu_share import ShareRule, plan_gpu_share, valid_tensor_parallel
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.build_choice import BuildRule
from app.hardware.model import GPUInfo, Hardware
from app.lanes.engines import nodes_seam
from app.lanes.engines.kind import (
    EnginePython,
    engine_process_env,
    engine_python,
    files_footprint,
    find_binary,
)
from app.lanes.engines.plan import ApiStyle, LaunchPlan, StartContext
from app.lanes.engines.python_kind import PythonEngineKind
from app.lanes.install.containers import engine_in_container, load_images
from app.lanes.install.runtimes import PACKAGE, choose_engine_runtime, engine_install
from app.lanes.proc import settings_env
from app.lanes.residency import Footprint
from app.library.model import ModelEntry
from app.routing.model import LaneInstall
from app.routing.traits import CUDA_MIN_CC

DEFAULT_MAX_LEN_CAP = 32768  # the window asked for when none is set: long enough, and KV stays bounded

# vLLM, --gpu-memory-utilization F: it refuses to start unless the free memory is at least F x the card's
# TOTAL; it loads the weights, profiles one forward pass of --max-num-batched-tokens tokens (and a sampler
# pass over --max-num-seqs sequences), and what of F x total is left after weights, the activation peak
# and non-torch allocations (cuBLAS workspaces) becomes KV cache, in blocks of 16 tokens (its block size on
# CUDA). Its CUDA context and NCCL buffers exist before it measures and its CUDA graphs are captured after
# the KV cache (its log: the profile "does not consider CUDAGraph memory"), so all three sit outside F.
# Sliding-window layers keep only `window - 1 + max_num_batched_tokens` tokens (+1 block) per request.
# It refuses bf16 below compute capability 8.0 unless told --dtype half.
VLLM_SHARE = ShareRule(
    name="vllm",
    basis="total",
    activations_inside=True,
    kv_block_tokens=16,
    batch_covers_seqs=True,
    fraction_flag="--gpu-memory-utilization",
    length_flag="--max-model-len",
    tp_flag="--tensor-parallel-size",
    batch_flag="--max-num-batched-tokens",
    seqs_flag="--max-num-seqs",
    pool_flag=None,
    kv_dtype_flag="--kv-cache-dtype",
    kv_dtypes=(("fp8", "fp8"), ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")),
    half_flags=("--dtype", "half"),
)
# SGLang, --mem-fraction-static F: F applies to the memory free when it measures (after its CUDA context
# and NCCL, before the weights); the KV pool gets F x free - weights, activations and CUDA graphs the rest.
# --max-total-tokens caps the pool at the planned size when the card is emptier than planned. Every layer
# is counted at full length (its pool does that except for a few hybrid sliding-window models). It
# switches bf16 to fp16 by itself on older cards. One percent is added to F: its profile counts in float
# GiB after load-time buffers, and the pool is capped anyway.
SGLANG_SHARE = ShareRule(
    name="sglang",
    basis="free",
    activations_inside=False,
    kv_block_tokens=None,
    batch_covers_seqs=False,
    fraction_flag="--mem-fraction-static",
    length_flag="--context-length",
    tp_flag="--tp-size",
    batch_flag="--chunked-prefill-size",
    seqs_flag="--max-running-requests",
    pool_flag="--max-total-tokens",
    kv_dtype_flag="--kv-cache-dtype",
    kv_dtypes=(("fp8", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")),
    fraction_slack=1,
)


@dataclass(frozen=True)
class CudaParams:
    model_path: str
    served_name: str
    engine: str
    max_model_len: int
    tensor_parallel: int
    gpus: tuple[int, ...]
    fraction: float
    extra_args: tuple[str, ...]


def nvidia_cards(hardware: Hardware | None) -> list[GPUInfo]:
    return [g for g in (hardware.gpus if hardware else ()) if g.vendor == "nvidia" and g.memory_total]


def compute_capability(gpu: GPUInfo) -> tuple[int, int]:
    """An NVIDIA card's compute capability as (major, minor); (0, 0) where the driver gave none."""
    try:
        major, minor = (gpu.compute_capability or "0.0").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def cuda_refusal(hardware: Hardware | None) -> str | None:
    if hardware is None:
        return "the hardware was not probed (plan_memory is off), and the GPU share needs the card's size"
    cards = nvidia_cards(hardware)
    if not cards:
        return "it needs an NVIDIA GPU with CUDA, and none was found"
    if all(compute_capability(g) < CUDA_MIN_CC for g in cards):
        return f"it needs compute capability {CUDA_MIN_CC[0]}.{CUDA_MIN_CC[1]} or newer (Volta)"
    return None


def max_model_len(model: SafetensorsModel, settings: Settings, model_id: str) -> int:
    asked = int(settings.override(model_id, "ctx_size", settings.models.ctx_size))
    if asked:
        return asked
    return min(model.config.max_position_embeddings or 8192, DEFAULT_MAX_LEN_CAP)


def cuda_plan(
    model: SafetensorsModel,
    *,
    engine: str,
    model_id: str,
    settings: Settings,
    hardware: Hardware,
    port: int,
    ppid: int,
    used: Mapping[str, int] | None = None,
    executable: str | None = None,
) -> LaunchPlan:
    """The command for `model` on vLLM or SGLang. Raises GPUShareRefused (a ModelTooLargeError) with the
    numbers when the card cannot hold it next to what other lanes were promised."""
    cards = sorted(nvidia_cards(hardware), key=lambda g: -(g.memory_total or 0))
    cards = [g for g in cards if compute_capability(g) >= CUDA_MIN_CC]
    if not cards or model.path is None:
        raise EngineUnavailableError(f"cannot start {model_id!r} on {engine}: {cuda_refusal(hardware)}")
    tp = valid_tensor_parallel(model, len(cards))
    group = cards[:tp]
    gpu = min(group, key=lambda g: g.memory_total or 0)  # the smallest card of the group bounds the share
    promised = max((used or {}).get(f"GPU{g.index}", 0) for g in group)
    length = max_model_len(model, settings, model_id)
    share = plan_gpu_share(
        model,
        gpu,
        engine=share_rule(engine),
        max_model_len=length,
        reserved_by_others=min(0.99, promised / (gpu.memory_total or 1)),
        reserved_for="the GPU lanes already loaded",
        tensor_parallel=tp,
        # KV for `parallel` full-length requests, not the whole card: what leaves room for a second lane
        concurrency=int(settings.override(model_id, "parallel", settings.models.parallel)),
        foreign_used=0,
        name=model_id,
    )
    extra = tuple(
        shlex.split(settings.cuda.vllm_extra_args if engine == "vllm" else settings.cuda.sglang_extra_args)
    )
    head: list[str]
    if engine == "vllm":
        head = [executable or "vllm", "serve", str(model.path), "--served-model-name", model_id]
    else:
        head = [executable or sys.executable, "-m", "sglang.launch_server", "--model-path", str(model.path)]
        head += ["--served-model-name", model_id]
    argv = [*module_argv("app.lanes.guard"), str(ppid), "--", *head]
    argv += ["--host", "127.0.0.1", "--port", str(port), *share.argv, *extra]
    env = settings_env(settings, kind=engine)
    # NVML's order is PCI order; make CUDA count the same way so the indexes we plan on are the ones used
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in group)
    env["HF_HUB_OFFLINE"] = "1"  # the model is a local folder; nothing to fetch
    env["VLLM_NO_USAGE_STATS"] = env["DO_NOT_TRACK"] = "1"
    params = CudaParams(
        model_path=str(model.path),
        served_name=model_id,
        engine=engine,
        max_model_len=length,
        tensor_parallel=tp,
        gpus=tuple(g.index for g in group),
        fraction=share.fraction,
        extra_args=extra,
    )
    devices = [{"device": f"GPU{g.index}", "total": share.card_bytes} for g in group]
    prediction = {
        "placement": f"{engine} share",
        "devices": devices,
        "total": share.card_bytes * tp,
        "share": share.public(),
    }
    return LaunchPlan(
        runtime=engine,
        argv=tuple(argv),
        env=env,
        health_path="/health",
        port=port,
        params=params,
        engine=engine,
        api=ApiStyle.OPENAI,
        memory="fraction",
        prediction=prediction,
        notes=share.notes,
    )


@dataclass(frozen=True, kw_only=True)
class CudaKind(PythonEngineKind):
    """vLLM or SGLang: a Python package in its own engine environment (the base's install and refusal),
    started as the engine's own server with a GPU share planned beside the other GPU lanes, so `build`
    needs the hardware and what is promised already, which the base's `launch` does not get. `share` is
    how its engine takes a share of a card (app/fit/gpu_share.py plans with it)."""

    share: ShareRule

    def install(self, settings: Settings) -> LaneInstall:
        # the package, else (runtime auto, docker or podman) the upstream image (lanes/install/runtimes.py)
        return engine_install(self.lane, settings, package=super().install(settings))

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        return super().start_refusal(settings, hardware) or cuda_refusal(hardware)

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        """A side model (embeddings, a reranker) guessed at its files' size; a share is known by its plan."""
        return files_footprint(entry) if entry.kind in ("embedding", "rerank") else None

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        hardware, free_port, ppid, used = start.hardware, start.port, start.ppid, start.used
        refusal = self.start_refusal(settings, hardware)
        if refusal or hardware is None:
            raise EngineUnavailableError(f"cannot start {entry.id!r} on {self.lane}: {refusal}")
        fmt = entry.model_format()
        if not isinstance(fmt.facts, SafetensorsModel):
            raise EngineUnavailableError(f"{entry.id!r} is not a safetensors model folder: {fmt.problem}")
        nodes = nodes_seam.nodes_of(settings, entry.id)
        if nodes:  # across paired peers (its `nodes`): the server's node broker starts every machine's part
            return nodes_seam.launch_across(self.lane, entry, settings, start, nodes)
        package = super().install(settings)
        choice = choose_engine_runtime(self.lane, settings, package=package, hardware=hardware)
        if choice.runtime is None:
            raise EngineUnavailableError(f"cannot start {entry.id!r} on {self.lane}: {choice.refusal()}")

        def plan_with(executable: str | None = None) -> LaunchPlan:
            assert isinstance(fmt.facts, SafetensorsModel)
            return cuda_plan(
                fmt.facts,
                engine=self.lane,
                model_id=entry.id,
                settings=settings,
                hardware=hardware,
                port=free_port,
                ppid=ppid,
                used=used,
                executable=executable,
            )

        if choice.runtime != PACKAGE and choice.build is not None:  # the upstream image
            return engine_in_container(
                plan_with(),
                cli=choice.runtime,
                image=load_images()[self.lane],
                build=choice.build,
                model_id=entry.id,
                model_path=entry.path,
                home=Paths.from_env().home,
                ppid=ppid,
                engine_env=settings.engines.engine_env.get(self.lane),
            )
        exe, engine = engine_program(self.lane)
        plan = plan_with(exe)
        return dataclasses.replace(plan, env=engine_process_env(dict(plan.env), engine, worker=False))


def engine_program(lane: str) -> tuple[str | None, EnginePython | None]:
    """What starts `lane`'s server here, and the engine environment it runs from (None: this interpreter):
    SGLang's Python (`-m sglang.launch_server`); vLLM's `vllm` beside that Python (the server's PATH may
    not hold it), else on PATH, else None."""
    kind = VLLM if lane == "vllm" else SGLANG
    engine = engine_python(kind.lane, kind.module, kind.dist())
    python = engine.python if engine and engine.managed else sys.executable
    if lane != "vllm":
        return python, engine
    beside = Path(python).with_name("vllm")
    return (str(beside) if beside.is_file() else find_binary("vllm", None)), engine


def _cuda_kind(lane: str, title: str, share: ShareRule) -> CudaKind:
    return CudaKind(
        share=share,
        lane=lane,
        title=title,
        runtime=lane,
        module=lane,
        hint=f"switchyard engine install {lane} or pip install {lane} (Linux, NVIDIA GPU)",
        formats=frozenset({"safetensors"}),
        offers=frozenset({"chat", "completions", "tools"}),
        memory="fraction",
        setting_keys=(f"{lane}_extra_args",),
        install_estimate_s=600,
        build_rule=BuildRule(
            name=lane, builds=frozenset({"cuda12", "cuda13", "rocm"}), needs="a CUDA or ROCm GPU"
        ),
    )


VLLM = _cuda_kind("vllm", "vLLM", VLLM_SHARE)
SGLANG = _cuda_kind("sglang", "SGLang", SGLANG_SHARE)
# the rules of the kinds whose memory is a share of the card, as explain shows them
SHARE_ENGINES: tuple[ShareRule, ...] = (VLLM.share, SGLANG.share)


def share_rule(lane: str) -> ShareRule:
    """The share rule of a GPU-share lane (vllm, sglang)."""
    rule = next((k.share for k in (VLLM, SGLANG) if k.lane == lane), None)
    if rule is None:
        raise EngineUnavailableError(f"{lane!r} is not a GPU-share lane; use one of vllm, sglang")
    return rule
