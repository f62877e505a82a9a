"""The mistral.rs lane: a GGUF file or a plain safetensors folder behind OpenAI's chat and completion routes.

The `mistralrs` wheel has no HTTP server, only a Python `Runner`; our worker (mistralrs_worker.py) hosts
one and speaks OpenAI's shape. mistral.rs sizes its KV cache itself, so memory is "runtime-managed": no
estimate is made up, and the footprint shown is the one measured after load. Routing puts llama.cpp first
for GGUF; mistral.rs runs a GGUF when the model is pinned to it, and plain safetensors where no CUDA lane
or MLX can (app/routing/traits.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.formats.detect import ModelKind, detect_format
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.cpu import usable_cores
from app.hardware.model import Hardware
from app.lanes.kind import dist_version, engine_process_env, engine_python, module_install, worker_argv
from app.lanes.plan import LaunchPlan
from app.lanes.proc import settings_env
from app.lanes.worker_params import MistralRsParams
from app.library.model import ModelEntry
from app.routing.engines import install_hint
from app.routing.model import LaneInstall
from app.routing.traits import quant_title

LANE = "mistral.rs"
# every build on PyPI installs the same `mistralrs` module: CPU, CUDA, Metal, MKL, Accelerate
DISTS = ("mistralrs", "mistralrs-cuda", "mistralrs-metal", "mistralrs-mkl", "mistralrs-accelerate")


def _dist() -> str:
    """The distribution that provides `mistralrs` here (its version is the engine's)."""
    return next((d for d in DISTS if dist_version(d) is not None), DISTS[0])


def plain_refusal(entry: ModelEntry) -> str | None:
    """Why a safetensors folder cannot be loaded by `Which.Plain` here, or None."""
    fmt = detect_format(entry.path)
    if fmt.kind is not ModelKind.SAFETENSORS or not isinstance(fmt.facts, SafetensorsModel):
        return fmt.problem or f"{entry.path} is not a safetensors model folder"
    quant = fmt.facts.quantization
    if quant is not None:
        name = quant_title(quant.method, quant.scheme) or quant.method
        return (
            f"its weights are {name}-quantized; this lane loads plain safetensors only. vLLM or SGLang run "
            "them on an NVIDIA GPU, or use a GGUF build of the model"
        )
    if not (entry.path / "tokenizer.json").is_file():
        # without it mistral.rs would try to fetch a tokenizer from the hub
        return f"there is no tokenizer.json in {entry.path}; download the model's tokenizer.json beside it"
    return None


class MistralRsKind:
    lane = LANE
    formats = frozenset({"gguf", "safetensors"})
    offers = frozenset({"chat", "completions"})
    memory = "runtime-managed"  # mistral.rs sizes its own KV cache; only the measured footprint is real

    def install(self, settings: Settings) -> LaneInstall:
        return module_install(self.lane, "mistralrs", _dist(), hint=install_hint(LANE))

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install(settings)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry) -> frozenset[str]:
        if entry.format == "gguf" and entry.facts is not None and entry.facts.is_embedding:
            return frozenset()  # an embedding GGUF: llama.cpp runs it, this lane does not
        return self.offers

    def build(
        self,
        entry: ModelEntry,
        settings: Settings,
        *,
        ppid: int,
        free_port: int,
        hardware: Hardware | None,
        used: Mapping[str, int] | None,
    ) -> LaunchPlan:
        refusal = self.start_refusal(settings, hardware) or self._model_refusal(entry)
        if refusal:
            raise EngineUnavailableError(f"cannot start {entry.id!r} on mistral.rs: {refusal}")
        if entry.format == "gguf":
            parts = entry.parts or (entry.path,)
            params = MistralRsParams(
                model_path=str(entry.path),
                alias=entry.id,
                source="gguf",
                files=tuple(p.name for p in parts),
                max_seqs=settings.override(entry.id, "parallel", settings.parallel),
            )
        else:
            params = MistralRsParams(
                model_path=str(entry.path),
                alias=entry.id,
                source="plain",
                files=(),
                max_seqs=settings.override(entry.id, "parallel", settings.parallel),
            )
        engine = engine_python(self.lane, "mistralrs", _dist())  # its own environment, if installed
        env = engine_process_env(settings_env(settings, kind=self.lane), engine, worker=True)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "HF_HUB_OFFLINE": "1",  # the model is local; nothing may be fetched behind the user's back
                "NO_COLOR": "1",  # plain log lines in the lane log
                # candle sizes its CPU thread pool from this: honour `threads` and the cgroup CPU quota
                "RAYON_NUM_THREADS": str(settings.threads or usable_cores()),
            }
        )
        argv = worker_argv("app.lanes.mistralrs_worker", params.to_json(), ppid=ppid, engine=engine)
        return LaunchPlan(
            "mistralrs", argv, env, "/health", None, params, engine=self.lane, memory=self.memory
        )

    def _model_refusal(self, entry: ModelEntry) -> str | None:
        if entry.format == "gguf":
            if entry.facts is not None and entry.facts.is_embedding:
                return "it is an embedding model; this lane runs generative models (llama.cpp runs it)"
            return None
        if entry.format == "safetensors":
            return plain_refusal(entry)
        return f"this lane runs GGUF files and plain safetensors folders, not {entry.format} models"
