"""Every engine kind Switchyard can start (the one place a kind is registered), and the choice of kind
for a catalog entry.

The contract of an engine kind (adding one is one line in KINDS below, in the lane order of facts.py):

- It lives in one module of app/lanes/engines/ (a sub-package when it has several parts, as llamacpp/),
  stateless: a module-level instance or a class whose instance is registered here. Code that runs inside
  the engine's own process goes to app/lanes/workers/, its install to app/lanes/install/.
- It says what it is (app/lanes/engines/kind.py `EngineKind`): `lane` (its id, which
  app/lanes/engines/facts.py describes and routes by), `formats`, `offers`, `memory`
  (plan.MEMORY_KINDS), `api_style` (plan.ApiStyle: llama-server's API or OpenAI's routes), `setting_keys`
  (the Settings fields only it reads: a change restarts its lanes), `draft` (plan.DraftKind: what a
  start pairs with the model), `install_estimate_s`, `build_rule` (the builds its package comes in),
  and answers `predict` (the memory a start will take, before it is measured) and `window` (the context
  its lane reports). Optional hooks (kind.py `KnowsOwnBuild`, `FoundByRegistration`) carry what only
  some kinds do, so callers ask the kind instead of its name.
- Its lane has one row in app/lanes/engines/facts.py: title, what it runs, install hint, which kinds of
  model route to it and in which order, and what machine it needs. Routing reads that table (it cannot
  import the kinds), so a new kind touches no routing file.
- `build(entry, settings, start)` takes the start's one frozen value (plan.StartContext: parent pid,
  port, hardware, memory other lanes hold) and returns the LaunchPlan, or raises a SwitchyardError that
  says what to do.
- Nothing outside app/lanes/engines/ names a lane or keeps a list of them: the rest of the app asks the
  kind, its plan (LaunchPlan.api) or this registry. tests/lanes/engines/test_registry.py polices both rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.core.errors import EngineUnavailableError, NoLaneForFormatError
from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.engines.cuda import SGLANG, VLLM
from app.lanes.engines.kind import EngineKind
from app.lanes.engines.llamacpp.compat import LlamaCompatKind
from app.lanes.engines.llamacpp.server import LlamaRuntimesKind
from app.lanes.engines.llamacpp.spec import with_draft
from app.lanes.engines.mistralrs import MISTRALRS, with_assistant
from app.lanes.engines.mlx import MLX
from app.lanes.engines.piper import PIPER
from app.lanes.engines.plan import DraftKind
from app.lanes.engines.sdcpp import SDCppKind
from app.lanes.engines.whisper import WHISPER
from app.library.model import ModelEntry
from app.routing.engines import install_hint, title
from app.routing.traits import traits_of, unroutable_reason

# Every kind, in the canonical lane order (app/lanes/engines/facts.py FACTS); kinds are stateless.
KINDS: tuple[EngineKind, ...] = (
    LlamaRuntimesKind(),  # llama.cpp on the runtime chosen for this machine
    LlamaCompatKind(),  # a second llama.cpp build, for architectures the first does not load
    MISTRALRS,
    MLX,
    VLLM,
    SGLANG,
    SDCppKind(),
    WHISPER,
    PIPER,
)


def engine_kinds() -> dict[str, EngineKind]:
    """The registered kinds by lane id, in the canonical lane order."""
    return {k.lane: k for k in KINDS}


def kind_of(lane: str) -> EngineKind | None:
    """The registered kind of a lane id, or None for one this Switchyard does not know."""
    return next((k for k in KINDS if k.lane == lane), None)


def calibrating_lanes() -> frozenset[str]:
    """The lanes whose measured speeds calibrate the bandwidth speed model (app/library/speeds.py): llama.cpp
    on its chosen runtime, whose timings the model's efficiency was fitted to. The capability lane's build
    may be another runtime, so its speeds would teach the default build's efficiency the wrong figure."""
    return frozenset(k.lane for k in KINDS if isinstance(k, LlamaRuntimesKind))


def default_lane(fmt: str) -> str | None:
    """The lane id of the first kind that runs `fmt` models (the one routing tries first)."""
    return next((k.lane for k in KINDS if fmt in k.formats), None)


def paired(
    kind: EngineKind,
    entry: ModelEntry,
    settings: Settings,
    library: Iterable[ModelEntry],
    *,
    hardware: Hardware | None,
) -> ModelEntry:
    """`entry` with what its start loads beside it for speculation, by the kind's `draft`: a draft model
    of the same vocabulary, an MTP assistant (both by app/library/drafts.py's tokenizer check), or none."""
    if kind.draft is DraftKind.DRAFT_MODEL:
        return with_draft(entry, settings, library)
    if kind.draft is DraftKind.MTP:
        return with_assistant(entry, settings, library, hardware=hardware)
    return entry


def kinds_for_format(fmt: str, kinds: dict[str, EngineKind]) -> list[EngineKind]:
    return [k for k in kinds.values() if fmt in k.formats]


def _routed(entry: ModelEntry, found: list[EngineKind]) -> list[EngineKind]:
    """The kinds routing lets run this safetensors folder, in routing's order: its quantization decides
    (plain weights: vLLM, SGLang, MLX, mistral.rs; AWQ, GPTQ, FP8: SGLang, vLLM)."""
    traits = traits_of(entry.model_format())
    if (why := unroutable_reason(traits)) is not None:
        raise NoLaneForFormatError(f"model {entry.id!r} cannot run here: {why}", param="model")
    order = {lane: i for i, lane in enumerate(traits.candidates)}
    return sorted((k for k in found if k.lane in order), key=lambda k: order[k.lane])


def choose_kind(
    entry: ModelEntry,
    settings: Settings,
    *,
    kinds: dict[str, EngineKind],
    hardware: Hardware | None,
    pinned: str | None,
) -> EngineKind:
    """The kind that starts `entry`: its pin, else the first kind for its format that can start here.

    Raises EngineUnavailableError naming what each candidate lacks."""
    if pinned:
        kind = kinds.get(pinned)
        if kind is None or entry.format not in kind.formats:
            raise EngineUnavailableError(
                f"model {entry.id!r} is pinned to {pinned}, which this Switchyard cannot start; "
                f"`switchyard pin {entry.id} --clear` or pin it to a lane that runs {entry.format} models"
            )
        candidates = [kind]
    else:
        candidates = kinds_for_format(entry.format, kinds)
        if entry.format == "safetensors":  # one format, several lanes: which depends on the weights
            candidates = _routed(entry, candidates)
    if not candidates:
        raise EngineUnavailableError(f"no lane runs {entry.format} models yet")
    why: list[str] = []
    for kind in candidates:
        refusal = kind.start_refusal(settings, hardware)
        if refusal is None:
            refusal = _architecture_refusal(kind, entry, settings, hardware)
        if refusal is None:
            return kind
        why.append(f"{title(kind.lane)}: {refusal}")
    hints = "; ".join(install_hint(k.lane) for k in candidates if not k.install(settings).installed)
    todo = f" To fix: {hints}." if hints else ""
    raise EngineUnavailableError(f"no lane can start {entry.id!r} here ({'; '.join(why)}).{todo}")


def _architecture_refusal(
    kind: EngineKind, entry: ModelEntry, settings: Settings, hardware: Hardware | None
) -> str | None:
    """A llama.cpp build's answer on the model's architecture (engines/llamacpp/compat.py; None elsewhere)."""
    ask = getattr(kind, "architecture_refusal", None)
    return ask(entry, settings, hardware) if ask is not None else None


def default_kind(entry: ModelEntry, kinds: dict[str, EngineKind]) -> EngineKind | None:
    """The kind a model would run on (for capability answers; no install checks)."""
    found = kinds_for_format(entry.format, kinds)
    return found[0] if found else None
