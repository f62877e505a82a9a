"""What a llama.cpp chat model offers one request, as /v1/models and Ollama's /api/show report it: the
per-slot context (the running lane's, else the one its next start would get), the output cap applied
when a request names none, and whether its chat template takes tools (app/lanes/lane_requests.py).

A start plan reads the model's header and costs tens of milliseconds, so plans are kept per model (until
the settings or the file change) and a listing plans only as many new ones as fit in LISTING_BUDGET_S: a
library of a thousand models answers at once, its rows gaining these fields over the next listings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from app.lanes.lane import Lane, LaneState
from app.lanes.lane_requests import request_limits, speaks_llama_server
from app.library.catalog import ModelEntry
from app.runtime import Runtime

LISTING_BUDGET_S = 0.5
Slot = tuple[int, int, int]  # (per slot, total, parallel)


def plannable(entry: ModelEntry) -> bool:
    return entry.format == "gguf" and entry.kind == "chat" and entry.facts is not None


class PlannedSlots:
    """The per-slot context each model's next start would get, kept per model; one per Gateway."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._slots: dict[str, tuple[Any, tuple[Any, ...], Slot | None]] = {}

    def _stamp(self, entry: ModelEntry) -> tuple[Any, ...]:
        try:
            mtime = entry.path.stat().st_mtime_ns
        except OSError:
            mtime = None
        return (str(entry.path), mtime)

    def known(self, entry: ModelEntry) -> tuple[bool, Slot | None]:
        """(whether a plan is kept for these settings and this file, its slot)."""
        kept = self._slots.get(entry.id)
        if kept is None or kept[0] is not self.rt.settings or kept[1] != self._stamp(entry):
            return False, None
        return True, kept[2]

    def fill(self, entries: Iterable[ModelEntry], *, budget_s: float) -> None:
        """Plan the entries not kept yet, until `budget_s` is spent (blocking: run it in a thread)."""
        deadline = time.monotonic() + budget_s
        for entry in entries:
            if time.monotonic() > deadline:
                return
            if self.known(entry)[0]:
                continue
            settings = self.rt.settings
            self._slots[entry.id] = (settings, self._stamp(entry), self._plan(entry.id))

    def _plan(self, model_id: str) -> Slot | None:
        found = self.rt.explain_brief(model_id)
        if (
            found is None
            or not speaks_llama_server(found.lane)
            or found.fit is None
            or found.fit.chosen is None
        ):
            return None
        params = found.fit.chosen.params
        return params.ctx_size // max(1, params.parallel), params.ctx_size, params.parallel


def limits_of(
    rt: Runtime, entry: ModelEntry, lane: Lane | None, *, slots: PlannedSlots
) -> dict[str, Any] | None:
    """{"context_length", "max_output", "tools"} of a GGUF chat model on llama.cpp, from its running lane
    or a kept plan; None for other models and where no plan is known (yet)."""
    if not plannable(entry):
        return None
    ctx = lane.slot_context() if lane is not None and lane.state is LaneState.READY else None
    if ctx is None:
        ctx = slots.known(entry)[1]
    if ctx is None:
        return None
    assert entry.facts is not None
    template = entry.facts.chat_template
    slot = ctx[0]
    if entry.facts.context_length:  # llama.cpp caps each slot at the trained context, whatever ctx_size
        slot = min(slot, entry.facts.context_length)
    return request_limits(entry.id, rt.settings, slot_ctx=slot, chat_template=template)


async def plan_for_listing(slots: PlannedSlots, entries: list[ModelEntry], *, budget_s: float) -> None:
    """Plan what is not kept yet of `entries`, off the event loop, for at most `budget_s`."""
    todo = [e for e in entries if plannable(e) and not slots.known(e)[0]]
    if todo:
        await asyncio.to_thread(slots.fill, todo, budget_s=budget_s)
