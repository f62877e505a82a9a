"""Where a bare model id runs when this machine cannot: the gateway's side of placement across peers.

The peers part (app/lanes/peers/placement.py) asks paired peers for their own plans; this part decides
when to ask: never for `PEER/MODEL` (the machine is pinned) or a lane already running here; for a model
this machine has, only when its memory plan here refuses it (`explain`'s verdict, kept `TTL_S` seconds
per settings); for a model it does not have, when a paired peer lists that id.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from app.core.errors import SwitchyardError
from app.core.units import fmt_bytes
from app.fit.lend import beyond, host_need, lend_budget
from app.library.catalog import ModelEntry
from app.runtime import Runtime

TTL_S = 30.0


class Placed(Protocol):
    peer: str
    model_id: str
    why: str

    def public(self) -> dict[str, Any]: ...


class Placer(Protocol):
    def holders(self, model: str) -> list[str]: ...

    async def elsewhere(self, model: str, *, here: str) -> Any: ...


class Placing:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.placer: Placer | None = None  # set while paired peers are served (app/server/admin/peers.py)
        self._here: dict[str, tuple[float, object, str | None]] = {}

    async def _not_here(self, entry: ModelEntry) -> str | None:
        """Why `entry` cannot run here (its plan refuses it), else None; kept TTL_S s per settings."""
        kept = self._here.get(entry.id)
        if kept is not None and kept[1] is self.rt.settings and time.monotonic() - kept[0] < TTL_S:
            return kept[2]
        why: str | None = None
        try:
            found = await self.rt.explain(entry.id)
        except SwitchyardError:  # an unplannable model is left to start here and say why
            pass
        else:
            fit = found.fit
            doc = fit.public() if fit is not None else None
            lends = lend_budget(self.rt.settings, found.hardware)
            if fit is not None and not fit.fits:
                why = f"it does not fit this machine: {fit.summary}"
            elif fit is not None and beyond(doc, lends):
                why = (
                    f"it does not fit this machine: it needs {fmt_bytes(host_need(doc))} of RAM and this "
                    f"machine lends models {fmt_bytes(lends)} (memory_reserve_mib, ram_budget_mib)"
                )
        self._here[entry.id] = (time.monotonic(), self.rt.settings, why)
        return why

    async def place(self, model: str, entry: ModelEntry | None) -> Placed | None:
        """The peer a request for `model` goes to instead of here, or None (it runs here, or nowhere)."""
        placer = self.placer
        if placer is None or not placer.holders(model):
            return None
        if entry is None:
            here = "this machine has no model of that id"
        else:
            lane = self.rt.supervisor.lanes.get(entry.id)
            if lane is not None and lane.available:
                return None
            why = await self._not_here(entry)
            if why is None:
                return None
            here = why
        placed: Placed | None = await placer.elsewhere(model, here=here)
        return placed
