"""Each machine's side of a multi-node vLLM or SGLang model (app/lanes/engines/multinode.py plans it): what a
machine checks of a part a head sent it before running anything, the process it then runs with its own
engine program, and the head's own process.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Collection, Sequence

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.model import GPUInfo
from app.lanes.engines.cuda import SGLANG, VLLM, engine_program
from app.lanes.engines.kind import EnginePython, engine_process_env, module_install
from app.lanes.engines.multinode import (
    TITLES,
    MultiNodePlan,
    NodeCommand,
    NodeLaunch,
    head_launch_plan,
    node_command,
)
from app.lanes.engines.plan import LaunchPlan

# ---- a part a peer sent: what this machine checks and runs ----------------------------------------------
# the variables a node takes from the head's launch: those `_launch` writes, nothing else (a launch that
# set LD_PRELOAD or PYTHONPATH would run the sender's choice of code on this machine)
PLAN_ENV = frozenset(
    {
        "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES",
        "HF_HUB_OFFLINE",
        "VLLM_NO_USAGE_STATS",
        "DO_NOT_TRACK",
        "VLLM_HOST_IP",
        "SGLANG_HOST_IP",
        "VLLM_PP_LAYER_PARTITION",
        "SGLANG_PP_LAYER_PARTITION",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
    }
)
MiB = 1 << 20
# the options a node takes from the head's launch: those `_launch` and the engine's share rule write, and
# sizing and scheduling options that load no code and name no file of this machine. Anything else the
# head's extra args add (--trust-remote-code, --worker-cls, --chat-template PATH, a plugin, a loader's
# config) runs here only if this machine's own extra args for that engine name it too: the head's user
# does not choose what code a peer runs.
_PLAN_FLAGS = frozenset(
    {"--served-model-name", "--nnodes", "--node-rank", "--headless", "--dtype", "--quantization", "--seed"}
)
PLAN_FLAGS = {
    "vllm": _PLAN_FLAGS
    | {
        "--pipeline-parallel-size",
        "--distributed-executor-backend",
        "--master-addr",
        "--master-port",
        *VLLM.share.flags(),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--block-size",
        "--swap-space",
        "--max-seq-len-to-capture",
        "--max-logprobs",
        "--disable-log-requests",
        "--disable-log-stats",
    },
    "sglang": _PLAN_FLAGS
    | {
        "--pp-size",
        "--dist-init-addr",
        *SGLANG.share.flags(),
        "--disable-cuda-graph",
        "--disable-radix-cache",
        "--attention-backend",
        "--schedule-policy",
        "--random-seed",
        "--log-level",
    },
}


def _lead(launch: NodeLaunch) -> tuple[str, ...]:
    """The words a launch of its engine begins with: that engine's server, on that model folder."""
    if launch.engine == "vllm":
        return ("serve", launch.model_path)
    return ("-m", "sglang.launch_server", "--model-path", launch.model_path)


def _options(words: Sequence[str]) -> set[str]:
    """The option names among an engine's words (`--name` or `--name=value`; values are the words between)."""
    return {w.split("=", 1)[0] for w in words if w.startswith("-")}


def own_flags(settings: Settings, engine: str) -> frozenset[str]:
    """The options this machine's own extra args for `engine` name (what it allows a head to pass)."""
    extra = settings.cuda.vllm_extra_args if engine == "vllm" else settings.cuda.sglang_extra_args
    return frozenset(_options(shlex.split(extra or "")))


def launch_refusals(
    launch: NodeLaunch,
    *,
    library: Collection[str],
    gpus: Sequence[GPUInfo],
    gpu_note: str | None = None,
    own_flags: Collection[str] = (),
) -> list[str]:
    """Why this machine will not run `launch` (sent by a peer), judged on its own: the launch's shape (a
    worker rank of vLLM or SGLang on a model folder of this machine's `library`, no options beyond the
    plan's and `own_flags` (this machine's own extra args), no variables beyond the plan's) and its own
    cards now (`gpus`, read just now; `gpu_note`: why none were read). Empty: it may."""
    if launch.engine not in TITLES:
        return [f"engine {launch.engine!r} has no multi-node part; a launch names vllm or sglang"]
    title = TITLES[launch.engine]
    out: list[str] = []
    if launch.rank < 1:
        out.append("rank 0 is the head's own process: a peer runs rank 1 or later")
    if launch.model_path not in library:
        out.append(
            f"{launch.model_path!r} is not a model folder of this machine's library: every machine of a "
            "multi-node model needs the same model files in its own library (pull it here first)"
        )
    elif launch.args[: len(_lead(launch))] != _lead(launch):
        out.append(f"the launch does not start {title}'s server on that folder ({' '.join(_lead(launch))})")
    odd = sorted(_options(launch.args[len(_lead(launch)) :]) - PLAN_FLAGS[launch.engine] - set(own_flags))
    if odd:
        key = "vllm_extra_args" if launch.engine == "vllm" else "sglang_extra_args"
        out.append(
            f"the launch passes {', '.join(odd)}, which this machine does not take from another (such an "
            f"option can load code or read files here): to allow it, add it to this machine's own "
            f"cuda.{key} too"
        )
    foreign = sorted(set(launch.env) - PLAN_ENV)
    if foreign:
        out.append(f"the launch sets {', '.join(foreign)}, which no multi-node plan sets")
    out += _card_refusals(launch, gpus, title=title, note=gpu_note)
    return out


def _card_refusals(launch: NodeLaunch, gpus: Sequence[GPUInfo], *, title: str, note: str | None) -> list[str]:
    nvidia = {g.index: g for g in gpus if g.vendor == "nvidia" and g.memory_total}
    if not nvidia:
        return [
            f"this machine has no NVIDIA GPU ({note or 'NVML lists none'}); {title} runs only on NVIDIA "
            "cards with CUDA"
        ]
    missing = [i for i in launch.gpus if i not in nvidia]
    if missing:
        return [
            f"the plan asks for GPU {', '.join(map(str, missing))} and this machine has NVIDIA GPU "
            f"{', '.join(map(str, sorted(nvidia)))}: the head planned from an old probe; check this machine "
            "again from the head (`switchyard peers check NAME`) and load again"
        ]
    out = []
    for i in launch.gpus:
        card = nvidia[i]
        if card.memory_free is None or card.memory_free < launch.card_bytes:
            free = "an unknown amount" if card.memory_free is None else f"{card.memory_free // MiB} MiB"
            out.append(
                f"GPU {i} ({card.name}) has {free} free and this part needs {launch.card_bytes // MiB} MiB "
                "on it: stop what else runs on that card here, or plan with fewer layers on this machine"
            )
    return out


def node_program(engine: str, settings: Settings) -> tuple[str, EnginePython | None]:
    """This machine's program for `engine`'s server and its engine environment; EngineUnavailableError
    saying what to install when it has none."""
    kind = VLLM if engine == "vllm" else SGLANG
    found = module_install(kind.lane, kind.module, kind.dist(), hint=kind.hint)
    if not found.installed:
        raise EngineUnavailableError(f"{kind.title} is not installed on this machine: {found.note}")
    exe, env = engine_program(kind.lane)
    if exe is None:
        raise EngineUnavailableError(
            f"{kind.title} is installed here but its `vllm` program is neither beside its Python nor on "
            "PATH: install it again (`switchyard engine install vllm`)"
        )
    return exe, env


def node_process(launch: NodeLaunch, *, settings: Settings, port: int | None, ppid: int) -> NodeCommand:
    """The process this machine starts for a peer's launch: its own engine program and environment."""
    exe, engine = node_program(launch.engine, settings)
    cmd = node_command(launch, settings=settings, executable=exe, port=port, ppid=ppid)
    return dataclasses.replace(cmd, env=engine_process_env(dict(cmd.env), engine, worker=False))


def head_plan(plan: MultiNodePlan, *, settings: Settings, port: int, ppid: int) -> LaunchPlan:
    """`head_launch_plan` with this machine's own engine program and environment."""
    exe, engine = node_program(plan.engine, settings)
    lane = head_launch_plan(plan, settings=settings, executable=exe, port=port, ppid=ppid)
    return dataclasses.replace(lane, env=engine_process_env(dict(lane.env), engine, worker=False))
