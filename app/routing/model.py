"""Routing inputs and the Decision it hands back, with its JSON form and its text for `switchyard explain`."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Literal

from app.formats.detect import ModelKind
from app.routing.engines import title

RejectionKind = Literal[
    "format",  # the lane does not read this kind of model
    "architecture",  # the installed engine version does not list the model's architecture
    "hardware",  # this machine cannot run the lane (or this model on it)
    "not_installed",
    "pinned_elsewhere",  # the lane could run it, but the user pinned the model to another lane
    "does_not_fit",  # the memory model says it does not fit this machine on that lane
    "broken_model",  # the files are unusable; the message is the format reader's reason
    "lower_preference",  # the lane could run it, but a lane earlier in the format's order was chosen
]


@dataclass(frozen=True)
class LaneInstall:
    """What the lanes module found out about one engine on this machine."""

    lane: str
    installed: bool
    version: str | None = None
    # Architectures the installed version lists (GGUF `general.architecture` names, HF class names or
    # model_type values, as the engine spells them); None: unknown, so any is tried.
    supported_architectures: frozenset[str] | None = None
    note: str = ""  # e.g. where it was found, or why it is unusable
    # Architectures this build was seen to refuse (a probe answer, arch_probe.py): refused even
    # where `supported_architectures` is unknown
    rejected_architectures: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FitCheck:
    """The memory model's verdict for one lane; `summary` is a sentence for people."""

    fits: bool
    summary: str


@dataclass(frozen=True)
class Rejection:
    lane: str
    kind: RejectionKind
    message: str  # says what to do about it

    def public(self) -> dict[str, str]:
        return {"lane": self.lane, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Decision:
    """`lane` None: nothing can run the model; `reasons` then say why. `rejections` has every other lane."""

    model_id: str
    format_kind: ModelKind
    lane: str | None
    reasons: tuple[str, ...]
    rejections: tuple[Rejection, ...]
    pinned: bool = False

    def rejection(self, lane: str) -> Rejection | None:
        return next((r for r in self.rejections if r.lane == lane), None)

    def public(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "format": self.format_kind.value,
            "lane": self.lane,
            "pinned": self.pinned,
            "reasons": list(self.reasons),
            "rejections": [r.public() for r in self.rejections],
        }

    def render_text(self, *, width: int = 100) -> str:
        """Readable lines for a terminal: the model, the lane, why, and every lane turned down."""
        chosen = f"{title(self.lane)}{' (pinned)' if self.pinned else ''}" if self.lane else "none"
        lines = [f"model:  {self.model_id} ({self.format_kind.value})", f"lane:   {chosen}", "why:"]
        for reason in self.reasons:
            lines += textwrap.wrap(reason, width, initial_indent="  - ", subsequent_indent="    ")
        if self.rejections:
            lines.append("turned down:")
        for r in self.rejections:
            lines.append(f"  {title(r.lane)} [{r.kind.replace('_', ' ')}]")
            lines += textwrap.wrap(r.message, width, initial_indent="      ", subsequent_indent="      ")
        return "\n".join(lines)
