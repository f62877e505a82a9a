"""Placement across machines: a model asked for by its bare id runs where it fits.

A request names `MODEL` (not `PEER/MODEL`, which pins the machine). When this machine has the model and
its plan fits here, it runs here, as always. When it does not fit here (the memory plan refuses it), or
this machine does not have it at all, the paired peers that list a model of that id are asked for their
own plan (`/peer/explain`, on their own memory), and the request goes to the one where it fits, the
fastest by its own estimate. Answers are kept `TTL_S` seconds, so a request pays for this once in a while,
not each time; a lane already running here is never second-guessed.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.errors import PeerUnavailableError
from app.lanes.remote.lane import RemoteState

if TYPE_CHECKING:
    from app.lanes.peers.registry import PeerRegistry

log = logging.getLogger("switchyard.peers.placement")
TTL_S = 30.0


@dataclass(frozen=True)
class Placed:
    """Where a bare model id goes instead of here, and why."""

    peer: str
    model_id: str  # PEER/MODEL
    why: str

    def public(self) -> dict[str, Any]:
        return {"peer": self.peer, "model": self.model_id, "why": self.why}


class Placer:
    def __init__(self, peers: PeerRegistry) -> None:
        self.peers = peers
        self._asked: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    def holders(self, model: str) -> list[str]:
        """The ready paired peers that list `model`."""
        out = []
        for name in sorted(self.peers.remotes.attached):
            remote = self.peers.remotes.remotes.get(name)
            if remote is None or remote.state is not RemoteState.READY:
                continue
            if any(m.id == model for m in remote.models()):
                out.append(name)
        return out

    async def _plan_on(self, peer: str, model: str) -> dict[str, Any] | None:
        """The peer's own plan for `model` (its /peer/explain `fit`), kept TTL_S seconds; None: none."""
        key = (peer, model)
        kept = self._asked.get(key)
        if kept is not None and time.monotonic() - kept[0] < TTL_S:
            return kept[1]
        try:
            doc = await self.peers.ask(peer, "GET", f"/peer/explain/{urllib.parse.quote(model, safe='/')}")
        except PeerUnavailableError as exc:
            log.info("placement: peer %s did not plan %s (%s)", peer, model, exc.message)
            doc = None
        fit = doc.get("fit") if isinstance(doc, dict) else None
        self._asked[key] = (time.monotonic(), fit if isinstance(fit, dict) else None)
        return self._asked[key][1]

    async def elsewhere(self, model: str, *, here: str) -> Placed | None:
        """The paired peer where `model` fits, the fastest by its own estimate; `here` says why not here."""
        best: tuple[float, str, dict[str, Any]] | None = None
        for peer in self.holders(model):
            fit = await self._plan_on(peer, model)
            if not fit or not fit.get("fits"):
                continue
            chosen = fit.get("chosen") or {}
            speed = float(chosen.get("tokens_per_s") or chosen.get("raw_tokens_per_s") or 0.0)
            if best is None or speed > best[0]:
                best = (speed, peer, fit)
        if best is None:
            return None
        _speed, peer, fit = best
        why = f"{here}; on peer {peer!r} it fits: {fit.get('summary', 'its plan fits')}"
        return Placed(peer=peer, model_id=f"{peer}/{model}", why=why)
