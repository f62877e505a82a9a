"""The mistral.rs lane: a GGUF file or a plain safetensors folder behind OpenAI's chat and completion routes.

The `mistralrs` wheel has no HTTP server, only a Python `Runner`; our worker
(app/lanes/workers/mistralrs.py) hosts one and speaks OpenAI's shape. mistral.rs sizes its KV cache itself,
so memory is "runtime-managed": no estimate is made up, and the footprint shown is the one measured after
load. Routing puts llama.cpp first
for GGUF; mistral.rs runs a GGUF when the model is pinned to it, and plain safetensors where no CUDA lane
or MLX can (app/routing/traits.py).

Speculation: the Runner (mistralrs 0.9.5) drafts only with an MTP assistant, a small checkpoint made for
one target model (`mtp_model`, with `mtp_n_predict` tokens proposed per step), and only under
PagedAttention (CUDA or Metal). So `speculative` `{"type": "draft", "draft": <the assistant's id>,
"n_max": N}` maps onto it, paired by the tokenizer check of app/library/drafts.py; every other kind or
knob is refused at the start with what this lane takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.core.speculation import Speculation, speculation_of
from app.formats.detect import ModelKind
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.build_choice import BuildRule
from app.hardware.model import Hardware
from app.lanes.engines.mistralrs_api import LaneParams
from app.lanes.engines.plan import DraftKind
from app.lanes.engines.python_kind import PythonEngineKind, Worker
from app.library.drafts import choose_draft
from app.library.model import ModelEntry
from app.routing.engines import install_hint
from app.routing.machine import apple_silicon
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


# the one speculation this lane takes, in the setting's own words
DRAFT_SHAPE = '{"type": "draft", "draft": "<the MTP assistant\'s model id>", "n_max": N}'
SPEC_SHAPE = DRAFT_SHAPE + ' or {"type": "off"}'


def speculation_for(model_id: str, settings: Settings) -> Speculation:
    return speculation_of(settings.override(model_id, "speculative", None))


def speculation_refusal(entry: ModelEntry, spec: Speculation, *, hardware: Hardware | None) -> str | None:
    """Why this lane cannot start `entry` with `spec`, or None. `entry.draft` is the assistant paired
    by `with_assistant`; `hardware` None (unknown) leaves the device check to the engine."""
    if not spec.on:
        return None
    if (why := setting_refusal(entry, spec, hardware=hardware)) is not None:
        return why
    return _assistant_refusal(entry, spec)


def setting_refusal(entry: ModelEntry, spec: Speculation, *, hardware: Hardware | None) -> str | None:
    """The refusals that need no paired assistant: the setting itself and this machine (checked before
    the pairing, so a setting this lane cannot take is named as such, not as a pairing failure)."""
    if not spec.on:
        return None
    where = f"model_overrides[{entry.id!r}].speculative"
    fix = f"set {where} to {SPEC_SHAPE}"
    if spec.type != "draft":
        return (
            f"mistral.rs has no n-gram speculation ({spec.type!r}): it drafts only with an MTP assistant; "
            f"{fix}, or run the model on llama.cpp, which has the n-gram kinds"
        )
    if knobs := [k for k in ("n_min", "p_min") if getattr(spec, k) is not None]:
        return f"mistral.rs has no {' or '.join(knobs)} for its drafts (it takes draft and n_max); {fix}"
    if spec.draft is None:
        return (
            "mistral.rs drafts with an MTP assistant made for the model (for Gemma 4, its -assistant "
            f"checkpoint), which the library cannot propose: name it in {where}, {DRAFT_SHAPE}"
        )
    if hardware is not None and not (
        apple_silicon(hardware) or any(g.vendor == "nvidia" for g in hardware.gpus)
    ):
        return (
            "mistral.rs runs an MTP assistant only under PagedAttention, which needs an NVIDIA (CUDA) or "
            f'Apple Silicon (Metal) GPU, and this machine has neither; set {where} to {{"type": "off"}}, '
            "or run the model on llama.cpp, which drafts on the CPU"
        )
    return None


def _assistant_refusal(entry: ModelEntry, spec: Speculation) -> str | None:
    fix = f"set model_overrides[{entry.id!r}].speculative to {SPEC_SHAPE}"
    if entry.draft is None:
        return f"the MTP assistant {spec.draft!r} was not paired with it for this start; {fix}"
    if not entry.draft.is_dir():
        return (
            f"mistral.rs loads an MTP assistant from a model folder (config.json and safetensors), and "
            f"{spec.draft!r} is the file {entry.draft.name}; {fix}"
        )
    return None


def with_assistant(
    entry: ModelEntry,
    settings: Settings,
    library: Iterable[ModelEntry],
    *,
    hardware: Hardware | None = None,
) -> ModelEntry:
    """`entry` with the MTP assistant its start loads (type "draft", `draft` named), unchanged otherwise.
    A setting this lane cannot take at all is refused first (setting_refusal); then the assistant must
    pass drafts.py's tokenizer check (the one llama.cpp's drafts pass); one that does not is refused
    here, with the reason."""
    spec = speculation_for(entry.id, settings)
    if (why := setting_refusal(entry, spec, hardware=hardware)) is not None:
        raise EngineUnavailableError(f"cannot start {entry.id!r} on mistral.rs: {why}")
    if spec.type != "draft" or spec.draft is None:
        return entry  # the start refuses what this lane cannot do (speculation_refusal)
    pairing = choose_draft(entry, library, named=spec.draft)
    if pairing.draft is None:
        raise EngineUnavailableError(
            f"cannot start {entry.id!r} on mistral.rs with the MTP assistant {spec.draft!r}: "
            f"{pairing.reason}; fix model_overrides[{entry.id!r}].speculative, or set it to "
            '{"type": "off"}'
        )
    return dataclasses.replace(entry, draft=pairing.draft.path)


def mistralrs_params(entry: ModelEntry, settings: Settings) -> LaneParams:
    gguf = entry.format == "gguf"
    spec = speculation_for(entry.id, settings)
    assistant = entry.draft if spec.type == "draft" and entry.draft is not None else None
    return LaneParams(
        model_path=str(entry.path),
        alias=entry.id,
        source="gguf" if gguf else "plain",
        files=tuple(p.name for p in entry.parts or (entry.path,)) if gguf else (),
        max_seqs=settings.override(entry.id, "parallel", settings.models.parallel),
        mtp_model=str(assistant) if assistant else "",
        mtp_n_predict=(spec.n_max or 0) if assistant else 0,
    )


@dataclass(frozen=True, kw_only=True)
class MistralRsKind(PythonEngineKind):
    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        if entry.format == "gguf" and entry.facts is not None and entry.facts.is_embedding:
            return frozenset()  # an embedding GGUF: llama.cpp runs it, this lane does not
        return self.offers

    def settings_refusal(
        self, entry: ModelEntry, settings: Settings, hardware: Hardware | None
    ) -> str | None:
        # the speculation refused before the model is loaded (mistral.rs would load the weights first and
        # only then fail to attach the assistant)
        return speculation_refusal(entry, speculation_for(entry.id, settings), hardware=hardware)

    def model_refusal(self, entry: ModelEntry) -> str | None:
        if entry.format == "gguf":
            if entry.facts is not None and entry.facts.is_embedding:
                what = "a reranker" if entry.facts.is_reranker else "an embedding model"
                return f"it is {what}; this lane runs generative models (llama.cpp runs it)"
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
    worker=Worker("app.lanes.workers.mistralrs", mistralrs_params),
    env=(
        ("HF_HUB_OFFLINE", "1"),  # the model is local; nothing may be fetched behind the user's back
        ("NO_COLOR", "1"),  # plain log lines in the lane log
    ),
    # candle sizes its CPU thread pool from this: honour `threads` and the cgroup CPU quota
    threads_env="RAYON_NUM_THREADS",
    draft=DraftKind.MTP,  # an MTP assistant, paired by `with_assistant`
    install_estimate_s=90,
    build_rule=BuildRule(name="mistral.rs", builds=frozenset({"cuda12", "cuda13", "metal"})),
)
