"""`decide`: which lane runs a model on this machine, why, and why every other lane does not.

Pure: the caller gathers the model's format, the hardware, the installed engines, the pins and the memory
model's verdicts; nothing here reads a file or starts a process.

Each lane is checked in this order, and the first check it fails is its rejection: the model is broken
(`broken_model`), the lane does not read this kind of model (`format`), this machine cannot run it
(`hardware`), it is not installed (`not_installed`), its version does not list the architecture
(`architecture`), the memory model says it does not fit (`does_not_fit`). Of the lanes left, a valid pin
wins; otherwise the first in the format's preference order. The others that could run it are
`pinned_elsewhere` (under a pin) or `lower_preference`.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.formats.detect import ModelFormat, ModelKind
from app.formats.gguf_adapter import ADAPTER_NOTE
from app.hardware.model import Hardware
from app.lanes.engines.facts import FACTS, facts_of
from app.routing.engines import LANES, install_hint, title, titles
from app.routing.machine import hardware_reason, hardware_refusal
from app.routing.model import Decision, FitCheck, LaneInstall, Rejection, RejectionKind
from app.routing.traits import (
    PROJECTOR_ALONE,
    ModelTraits,
    format_reason,
    format_refusal,
    traits_of,
    unroutable_reason,
)

FitFn = Callable[[str], FitCheck | None]


@dataclass(frozen=True)
class _Verdict:
    lane: str
    rejection: Rejection | None  # None: the lane can run the model
    reasons: tuple[str, ...] = ()  # why it can, when it can


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _not_installed(lane: str, install: LaneInstall | None) -> str:
    found = f" ({install.note})" if install and install.note else ""
    return f"{title(lane)} is not installed{found}. To use it: {install_hint(lane)}."


def _architecture_refusal(lane: str, traits: ModelTraits, install: LaneInstall) -> str | None:
    refused = {a.casefold() for a in install.rejected_architectures}
    if traits.architectures and all(a.casefold() in refused for a in traits.architectures):
        name = title(lane)
        engine = f"{name} ({install.version})" if install.version else name
        tip = f.architecture_tip if (f := facts_of(lane)) else ""
        return f"{engine} does not load the {traits.architecture} architecture (it said so when asked)" + (
            f"; {tip}." if tip else "."
        )
    supported = install.supported_architectures
    if supported is None or not traits.architectures:
        return None  # unknown either way: let the engine try
    folded = {a.casefold() for a in supported}
    if any(a.casefold() in folded for a in traits.architectures):
        return None
    name = title(lane)
    engine = f"{name} {install.version}" if install.version else f"the installed {name} (version unknown)"
    others = [c for c in traits.candidates if c != lane]
    alt = f", or use {titles(others)}" if others else ""
    return (
        f"{engine} does not support the {traits.architecture} architecture; upgrade {name} "
        f"(newer releases add architectures){alt}."
    )


def _installed_reason(lane: str, install: LaneInstall) -> str:
    version = f" {install.version}" if install.version else ""
    note = f" ({install.note})" if install.note else ""
    return f"{title(lane)}{version} is installed{note}."


@dataclass(frozen=True)
class _Weighing:
    """One model on this machine: what each lane's verdict is read from."""

    traits: ModelTraits
    hardware: Hardware
    installed: Mapping[str, LaneInstall]
    fit: FitFn | None

    def verdict(self, lane: str) -> _Verdict:
        def no(kind: RejectionKind, message: str) -> _Verdict:
            return _Verdict(lane, Rejection(lane, kind, message))

        if self.traits.problem and (self.traits.kind is ModelKind.UNKNOWN or lane in self.traits.candidates):
            return no("broken_model", self.traits.problem)
        if lane not in self.traits.candidates:
            return no("format", format_refusal(lane, self.traits))
        refusal = hardware_refusal(lane, self.traits, self.hardware)
        if refusal:
            return no("hardware", refusal)
        install = self.installed.get(lane)
        if install is None or not install.installed:
            return no("not_installed", _not_installed(lane, install))
        unsupported = _architecture_refusal(lane, self.traits, install)
        if unsupported:
            return no("architecture", unsupported)
        check = self.fit(lane) if self.fit is not None else None
        if check is not None and not check.fits:
            return no("does_not_fit", check.summary)
        reasons = (
            format_reason(lane, self.traits),
            hardware_reason(lane, self.traits, self.hardware),
            _installed_reason(lane, install),
            f"It fits: {check.summary}" if check is not None else None,
        )
        return _Verdict(lane, None, tuple(r for r in reasons if r))


def _lanes(traits: ModelTraits, installed: Mapping[str, LaneInstall]) -> tuple[ModelTraits, tuple[str, ...]]:
    """The traits and lanes to weigh: a lane weighed only while a build is registered (llama.cpp-compat,
    `registered_only`) is left out altogether without one, so nothing changes for anyone who has none."""
    absent = {
        f.id
        for f in FACTS
        if f.registered_only and not ((i := installed.get(f.id)) is not None and i.installed)
    }
    if not absent:
        return traits, LANES
    candidates = tuple(lane for lane in traits.candidates if lane not in absent)
    return dataclasses.replace(traits, candidates=candidates), tuple(x for x in LANES if x not in absent)


def _missing(lane: str, installed: Mapping[str, LaneInstall]) -> Rejection:
    return Rejection(lane, "not_installed", _not_installed(lane, installed.get(lane)))


def _refusal_text(verdict: _Verdict) -> str | None:
    r = verdict.rejection
    if r is None:
        return None
    return f"{title(r.lane)} cannot run this model ({r.kind.replace('_', ' ')}). {_sentence(r.message)}"


def _no_such_lane(lane: str) -> str:
    return f"there is no lane named {lane!r}; the lanes are {', '.join(LANES)}."


def check_pin(
    fmt: ModelFormat,
    lane: str,
    *,
    hardware: Hardware,
    installed: Mapping[str, LaneInstall],
    fit: FitFn | None = None,
) -> str | None:
    """Why pinning this model to `lane` is refused (for `switchyard pin`); None: the lane can run it."""
    if lane not in LANES:
        return _no_such_lane(lane)
    traits, lanes = _lanes(traits_of(fmt), installed)
    if lane not in lanes:  # the capability lane with no build registered
        return _refusal_text(_Verdict(lane, _missing(lane, installed)))
    return _refusal_text(_Weighing(traits, hardware, installed, fit).verdict(lane))


def _kinds(verdicts: list[_Verdict]) -> str:
    kinds = dict.fromkeys(v.rejection.kind.replace("_", " ") for v in verdicts if v.rejection)
    return ", ".join(kinds)


def _nothing_reason(traits: ModelTraits, verdicts: Mapping[str, _Verdict]) -> str:
    if traits.problem == ADAPTER_NOTE:  # whole and well, but not a model: it rides on its base model
        return f"Nothing runs it on its own: {_sentence(traits.problem)}"
    if traits.problem:
        return f"Nothing can run it; the model files are unusable: {_sentence(traits.problem)}"
    if traits.kind is ModelKind.MMPROJ:
        return f"Nothing runs it on its own: {PROJECTOR_ALONE}; choose the language model it belongs to."
    unroutable = unroutable_reason(traits)
    if unroutable:
        return f"Nothing can run it: {_sentence(unroutable)}"
    tried = [verdicts[c] for c in traits.candidates]
    return (
        f"Nothing can run {traits.description} here: every lane that reads it was turned down "
        f"({_kinds(tried)}); see below for what to do."
    )


def _passed_over(chosen: str, traits: ModelTraits, verdicts: Mapping[str, _Verdict]) -> str | None:
    if chosen not in traits.candidates:
        return None
    earlier = [verdicts[c] for c in traits.candidates[: traits.candidates.index(chosen)]]
    if not earlier:
        return None
    names = titles([v.lane for v in earlier], joiner="and")
    one = len(earlier) == 1
    return (
        f"{names} come{'s' if one else ''} first for {traits.description} but {'was' if one else 'were'} "
        f"turned down ({_kinds(earlier)}); see below."
    )


def _other(
    verdict: _Verdict, chosen: str | None, *, pinned: bool, model_id: str, traits: ModelTraits
) -> Rejection:
    """A lane that was not chosen: its own rejection, or (it could run the model) why another won."""
    if verdict.rejection is not None:
        return verdict.rejection
    if chosen is None:  # cannot happen (a lane that can run the model is chosen); keeps the types honest
        return Rejection(verdict.lane, "format", format_refusal(verdict.lane, traits))
    lane = verdict.lane
    if pinned:
        return Rejection(
            lane,
            "pinned_elsewhere",
            f"{title(lane)} could run it too, but you pinned this model to {title(chosen)}; "
            f"`switchyard pin {shlex.quote(model_id)} {lane}` to use {title(lane)} instead.",
        )
    return Rejection(
        lane,
        "lower_preference",
        f"{title(lane)} can run it too; {title(chosen)} comes first for {traits.description}. "
        f"`switchyard pin {shlex.quote(model_id)} {lane}` to use {title(lane)} instead.",
    )


def decide(
    fmt: ModelFormat,
    *,
    hardware: Hardware,
    installed: Mapping[str, LaneInstall],
    pins: Mapping[str, str] | None = None,
    model_id: str,
    fit: FitFn | None = None,
) -> Decision:
    """The lane for `model_id`, the reasons in order, and every other lane with why it was turned down.

    A pin to a lane that can run the model chooses it. A pin to one that cannot is refused: the usual choice
    applies and the first reason says why the pin was refused. No lane at all: `lane` is None."""
    traits, lanes = _lanes(traits_of(fmt), installed)
    weighing = _Weighing(traits, hardware, installed, fit)
    verdicts = {lane: weighing.verdict(lane) for lane in lanes}
    pin = (pins or {}).get(model_id)
    refused = None
    if pin is not None:
        if pin in verdicts:
            refused = _refusal_text(verdicts[pin])
        elif pin in LANES:  # the capability lane with no build registered: not weighed, but a real lane
            refused = _refusal_text(_Verdict(pin, _missing(pin, installed)))
        else:
            refused = _no_such_lane(pin)
    pinned = pin is not None and refused is None
    usual = next((c for c in traits.candidates if verdicts[c].rejection is None), None)
    chosen = pin if pinned else usual

    reasons: list[str] = []
    if refused:
        reasons.append(
            f"The pin to {title(pin or '')} was refused: {refused} The usual choice applies instead."
        )
    if pinned and chosen is not None:
        reasons.append(f"You pinned this model to {title(chosen)}.")
    if chosen is None:
        reasons.append(_nothing_reason(traits, verdicts))
    else:
        own = verdicts[chosen].reasons
        passed = None if pinned else _passed_over(chosen, traits, verdicts)
        reasons += [own[0], *([passed] if passed else []), *own[1:]]

    # The lanes that read this format first, in preference order, then the rest in the canonical order.
    order = [*traits.candidates, *(lane for lane in lanes if lane not in traits.candidates)]
    rejections = tuple(
        _other(verdicts[lane], chosen, pinned=pinned, model_id=model_id, traits=traits)
        for lane in order
        if lane != chosen
    )
    return Decision(
        model_id=model_id,
        format_kind=fmt.kind,
        lane=chosen,
        reasons=tuple(reasons),
        rejections=rejections,
        pinned=pinned,
    )
