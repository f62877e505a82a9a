"""What pairs with what in the library: the vision projector (mmproj) a text GGUF loads with, the LoRA
adapters a GGUF model can take (and the models an adapter can be loaded on), and the draft models that
can speed a model up by speculative decoding (drafts.py decides each pairing; this lists the choices).

**Projectors.** A projector pairs with a text model when it sits in the same folder (or the same Hugging
Face snapshot) and its `clip.vision.projection_dim` equals the text model's embedding length: llama.cpp
refuses any other at load. A header without that key pairs only when it is the one projector there.
`model_overrides[id].mmproj` names one explicitly, which wins over the automatic choice:
`ModelEntry.projector(settings)` (library/model.py) is the one rule for which projector loads, and every
surface asks it.

**LoRA adapters.** An adapter GGUF (`general.type = adapter`) pairs with a GGUF model when llama.cpp would
load it there: the same architecture, and every adapted weight present with the shape the adapter expects
(app/formats/gguf_adapter.py). The catalog lists an adapter as an adapter of the models it pairs with
(`pair_adapter`), never as a model; the Tune page offers a model the adapters that pair with it
(`adapter_choices`) and the drafts whose tokenizer matches (`draft_choices`), both through `pairings`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import ModelBrokenError, SettingsError
from app.core.settings import Settings
from app.core.speculation import Adapter, adapters_of
from app.formats.gguf_adapter import AdapterFacts, adapter_refusal, read_adapter
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.library.drafts import choose_draft, model_bytes
from app.library.model import ModelEntry, projector_for

__all__ = [
    "ADAPTER_KIND",
    "AdapterChoice",
    "AdapterPairing",
    "DraftChoices",
    "Pairings",
    "adapter_choices",
    "draft_choices",
    "is_projector_file",
    "pair_adapter",
    "pair_projector",
    "pairings",
    "projector_for",
    "projector_layout",
    "vision_projector",
]
# the kind of a LoRA adapter's catalog entry: listed, never served on its own
ADAPTER_KIND = "adapter"
_REFUSALS_NAMED = 3  # a "no base pairs" reason names this many models' refusals


def is_projector_file(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".gguf") and "mmproj" in name


def projector_layout(path: Path) -> GGUFLayout | None:
    """The layout of a vision projector GGUF, or None for a file that is not one (or cannot be read)."""
    got = read_gguf_layout(path)
    if not isinstance(got, GGUFLayout) or got.projector is None or not got.projector.has_vision_encoder:
        return None
    return got


def _candidates(folder: Path, *, recursive: bool) -> list[Path]:
    try:
        found = folder.rglob("*.gguf") if recursive else folder.glob("*.gguf")
        return sorted(p for p in found if is_projector_file(p))
    except OSError:
        return []


def pair_projector(
    model_path: Path, *, embedding_length: int | None, snapshot: Path | None = None
) -> Path | None:
    """The projector beside `model_path` (anywhere in `snapshot` for a Hugging Face snapshot) whose
    projection width matches `embedding_length`; None when none does."""
    if embedding_length is None:
        return None
    folder = snapshot if snapshot is not None else model_path.parent
    found = _candidates(folder, recursive=snapshot is not None)
    unsized: list[Path] = []
    for cand in found:
        layout = projector_layout(cand)
        if layout is None or layout.projector is None:
            continue
        dim = layout.projector.projection_dim
        if dim == embedding_length:
            return cand
        if dim is None:
            unsized.append(cand)
    return unsized[0] if len(found) == 1 and unsized else None


def vision_projector(entry: ModelEntry, settings: Settings) -> tuple[Path, GGUFLayout] | None:
    """The vision projector this model loads with (`ModelEntry.projector`: the override, else the pairing)
    and its layout; ModelBrokenError, in words, for one that is missing, not a projector, or the wrong
    width."""
    override = settings.override(entry.id, "mmproj", None)
    path = entry.projector(settings)
    if path is None:
        return None
    fix = f"fix or remove model_overrides[{entry.id!r}].mmproj" if override else "remove or replace it"
    if not path.is_file():
        raise ModelBrokenError(f"the vision projector {path} for {entry.id!r} does not exist; {fix}")
    layout = projector_layout(path)
    if layout is None or layout.projector is None:
        raise ModelBrokenError(f"{path} is not a vision projector (mmproj) GGUF; {fix}")
    want = entry.facts.embedding_length if entry.facts else None
    got = layout.projector.projection_dim
    if want is not None and got is not None and got != want:
        raise ModelBrokenError(
            f"the vision projector {path.name} is for a text model of width {got}, but {entry.id!r} has "
            f"width {want}; llama.cpp would refuse it at load; use the projector from this model's "
            f"repository ({fix})"
        )
    return path, layout


# ---- LoRA adapters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdapterPairing:
    """A LoRA adapter in the library: what it adapts, the library models (ids) llama.cpp would load it on,
    and, when there is none, why."""

    facts: AdapterFacts
    bases: tuple[str, ...]
    why: str | None = None

    def note(self) -> str:
        """What a listing says instead of a problem: whose adapter it is and how it loads, or why nothing
        in the library takes it."""
        if self.bases:
            return (
                f"LoRA adapter of {', '.join(self.bases)}, not a model of its own; load it with its base "
                f"through model_overrides[{self.bases[0]!r}].lora or the Library's Tune panel"
            )
        return f"LoRA adapter, not a model of its own; {self.why}"

    def public(self) -> dict[str, Any]:
        f = self.facts
        return {
            "architecture": f.architecture,
            "type": f.adapter_type,
            "rank": f.rank,
            "alpha": f.alpha,
            "weights": len(f.targets),
            "bases": list(self.bases),
            "why": self.why,
        }


Refusal = Callable[[AdapterFacts, ModelEntry], str | None]


def _refusal(adapter: AdapterFacts, base: ModelEntry) -> str | None:
    return adapter_refusal(adapter, base.path)


def pair_adapter(
    adapter: AdapterFacts, models: Sequence[ModelEntry], *, refusal: Refusal = _refusal
) -> AdapterPairing:
    """The servable GGUF models among `models` that llama.cpp would load `adapter` on (`refusal` says why
    not, per model; the catalog passes one that remembers its answers), or why none would."""
    arch = adapter.architecture
    if arch is None:
        why = "it names no architecture (general.architecture), so llama.cpp loads it on no model"
        return AdapterPairing(adapter, (), f"no base model in the library pairs with it: {why}")
    same = [m for m in models if m.ok and m.format == "gguf" and m.facts and m.facts.architecture == arch]
    if not same:
        why = f"no {arch} model is in the library; put the model it was made for in a models folder"
        return AdapterPairing(adapter, (), f"no base model in the library pairs with it: {why}")
    refused: dict[str, str] = {}
    bases = []
    for m in sorted(same, key=lambda m: m.id):
        if (no := refusal(adapter, m)) is None:
            bases.append(m.id)
        else:
            refused[m.id] = no
    if bases:
        return AdapterPairing(adapter, tuple(bases))
    named = [f"{mid}: {why}" for mid, why in list(refused.items())[:_REFUSALS_NAMED]]
    more = len(refused) - len(named)
    listed = "; ".join(named) + (f"; and {more} more {arch} models" if more > 0 else "")
    return AdapterPairing(adapter, (), f"no base model in the library pairs with it ({listed})")


# ---- what the Tune page offers a model (read in a thread) ---------------------------------------------
@dataclass(frozen=True)
class DraftChoices:
    """The drafts for one model: the library's proposal (None: none qualifies) and why, the other library
    models whose tokenizer matches, and why a draft the settings name is refused."""

    proposed: str | None
    reason: str
    others: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    # how many times smaller than the model each offered draft is (the proposal's and the others'): a
    # draft's guess costs about 1/ratio of a model step, which is what the picker shows as its effect
    ratios: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AdapterChoice:
    """One adapter offered: `file` as the `lora` setting names it (relative to the model's folder, else
    absolute); `problem` None when it pairs with the model, else why it does not (any more)."""

    file: str
    problem: str | None = None

    @property
    def name(self) -> str:
        return Path(self.file).name


@dataclass(frozen=True)
class Pairings:
    draft: DraftChoices
    adapters: tuple[AdapterChoice, ...]
    no_adapter: str  # what the list says when it is empty


def draft_choices(entry: ModelEntry, library: Sequence[ModelEntry], *, named: str | None) -> DraftChoices:
    """The library's proposed draft for `entry`, every other model whose tokenizer matches, and why the
    draft `named` (the settings') is refused when it is."""
    if entry.format != "gguf" or entry.facts is None:
        return DraftChoices(None, "speculative decoding runs on the llama.cpp lane, for GGUF models only")
    proposal = choose_draft(entry, library, named=None)
    proposed = proposal.draft.id if proposal.draft else None
    own = model_bytes(entry)
    sizes = {
        e.id: model_bytes(e) for e in library if e.id != entry.id and e.format == "gguf" and e.kind == "chat"
    }
    # only smaller drafts are offered: a draft as large as the model (or larger) costs more per guess than
    # the model's own step, so it can only slow replies down (a 240x larger one took 630 tok/s to 0.5); the
    # proposal is listed by name too when the settings name it
    others = tuple(
        sorted(
            mid
            for mid, size in sizes.items()
            if (mid != proposed or mid == named)
            and 0 < size < own
            and choose_draft(entry, library, named=mid).draft is not None
        )
    )
    refused = {}
    if named is not None and named != proposed and named not in others:
        size = sizes.get(named, 0)
        if own and size >= own:
            refused[named] = (
                f"it is {size / own:.1f}x the size of the model: each of its guesses costs more than the "
                "model's own step, so it would slow every reply; pick a smaller draft"
            )
        else:
            pairing = choose_draft(entry, library, named=named)
            refused[named] = pairing.rejected.get(named) or pairing.reason
    ratios = {mid: own / sizes[mid] for mid in (proposed, *others) if mid in sizes and sizes[mid] > 0}
    return DraftChoices(proposed, proposal.reason, others, refused, ratios)


def adapter_choices(
    entry: ModelEntry, entries: Sequence[ModelEntry], *, saved: Sequence[Adapter]
) -> tuple[AdapterChoice, ...]:
    """The saved adapters first, in their order, each with whether it still pairs; then every other
    adapter in the library (the catalog's adapter entries) that pairs with `entry` (llama.cpp's check: the
    architecture, and each adapted weight's shape), by name."""
    folder = entry.path.parent
    seen: set[str] = set()
    out = []
    for a in saved:
        path = Path(a.file).expanduser()
        path = path if path.is_absolute() else folder / path
        seen.add(_real(path))
        out.append(AdapterChoice(a.file, _adapter_problem(path, entry.path)))
    found = []
    for e in entries:
        if e.kind != ADAPTER_KIND or _real(e.path) in seen:
            continue
        facts = read_adapter(e.path)
        if facts is None or adapter_refusal(facts, entry.path) is not None:
            continue
        seen.add(_real(e.path))
        found.append(AdapterChoice(e.path.name if e.path.parent == folder else str(e.path)))
    return (*out, *sorted(found, key=lambda c: c.name))


def _adapter_problem(path: Path, base: Path) -> str | None:
    if not path.is_file():
        return f"{path} does not exist any more"
    facts = read_adapter(path)
    if facts is None:
        return "it is not a LoRA adapter GGUF"
    return adapter_refusal(facts, base)


def _real(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def pairings(entry: ModelEntry, entries: Sequence[ModelEntry], *, spec: Any, lora: Any) -> Pairings:
    """The drafts and adapters for `entry` among the library's `entries`, the saved ones included (`spec`
    and `lora`: the model's saved `speculative` and `lora` settings, as they are in the file)."""
    named = spec.get("draft") if isinstance(spec, dict) and isinstance(spec.get("draft"), str) else None
    entries = [e for e in entries if e.source != "alias"]  # an alias is its model again, by another name
    servable = [e for e in entries if e.ok]
    if entry.format != "gguf" or entry.facts is None:
        return Pairings(
            draft_choices(entry, servable, named=named),
            (),
            "LoRA adapters load with GGUF models, on the llama.cpp lane.",
        )
    try:
        saved = adapters_of(lora)
    except SettingsError:
        saved = ()
    none = (
        "None in the library pairs with this model; put a LoRA adapter GGUF made for it in a models folder."
    )
    return Pairings(
        draft_choices(entry, servable, named=named), adapter_choices(entry, entries, saved=saved), none
    )
