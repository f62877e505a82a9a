"""The mistral.rs lane: a GGUF file or a plain safetensors folder behind OpenAI's chat and completion routes.

The `mistralrs` wheel has no HTTP server, only a Python `Runner`; our worker (mistralrs_worker.py) hosts
one and speaks OpenAI's shape. mistral.rs sizes its KV cache itself, so memory is "runtime-managed": no
estimate is made up, and the footprint shown is the one measured after load. Routing puts llama.cpp first
for GGUF; mistral.rs runs a GGUF when the model is pinned to it, and plain safetensors where no CUDA lane
or MLX can (app/routing/traits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.settings import Settings
from app.formats.detect import ModelKind
from app.formats.safetensors_meta import SafetensorsModel
from app.lanes.python_kind import PythonEngineKind
from app.lanes.worker_params import MistralRsParams
from app.library.model import ModelEntry
from app.routing.engines import install_hint
from app.routing.traits import quant_title

LANE = "mistral.rs"
# every build on PyPI installs the same `mistralrs` module: CPU, CUDA, Metal, MKL, Accelerate
DISTS = ("mistralrs", "mistralrs-cuda", "mistralrs-metal", "mistralrs-mkl", "mistralrs-accelerate")


def plain_refusal(entry: ModelEntry) -> str | None:
    """Why a safetensors folder cannot be loaded by `Which.Plain` here, or None."""
    fmt = entry.model_format()
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


@dataclass(frozen=True, kw_only=True)
class MistralRsKind(PythonEngineKind):
    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        if entry.format == "gguf" and entry.facts is not None and entry.facts.is_embedding:
            return frozenset()  # an embedding GGUF: llama.cpp runs it, this lane does not
        return self.offers

    def worker_params(self, entry: ModelEntry, settings: Settings) -> MistralRsParams:
        gguf = entry.format == "gguf"
        return MistralRsParams(
            model_path=str(entry.path),
            alias=entry.id,
            source="gguf" if gguf else "plain",
            files=tuple(p.name for p in entry.parts or (entry.path,)) if gguf else (),
            max_seqs=settings.override(entry.id, "parallel", settings.parallel),
        )

    def model_refusal(self, entry: ModelEntry) -> str | None:
        if entry.format == "gguf":
            if entry.facts is not None and entry.facts.is_embedding:
                return "it is an embedding model; this lane runs generative models (llama.cpp runs it)"
            return None
        if entry.format == "safetensors":
            return plain_refusal(entry)
        return f"this lane runs GGUF files and plain safetensors folders, not {entry.format} models"


MISTRALRS = MistralRsKind(
    lane=LANE,
    title="mistral.rs",
    runtime="mistralrs",
    module="mistralrs",
    dists=DISTS,
    hint=install_hint(LANE),
    formats=frozenset({"gguf", "safetensors"}),
    offers=frozenset({"chat", "completions"}),
    memory="runtime-managed",  # mistral.rs sizes its own KV cache; only the measured footprint is real
    worker="app.lanes.mistralrs_worker",
    env=(
        ("HF_HUB_OFFLINE", "1"),  # the model is local; nothing may be fetched behind the user's back
        ("NO_COLOR", "1"),  # plain log lines in the lane log
    ),
    # candle sizes its CPU thread pool from this: honour `threads` and the cgroup CPU quota
    threads_env="RAYON_NUM_THREADS",
)
