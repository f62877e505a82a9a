"""The seam between the llama.cpp kind and a split across machines (app/lanes/peers/split.py).

A model whose overrides name `split: [PEER, ...]` is started by whoever registered here (the running
server's split broker, which owns the peers and the tunnels); the kind asks this module, so the engines
never import the peers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.core.settings import Settings
from app.lanes.engines.nodes_seam import peers_named
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.library.model import ModelEntry


class SplitLauncher(Protocol):
    def launch_plan(
        self, entry: ModelEntry, settings: Settings, start: StartContext, names: Sequence[str]
    ) -> LaunchPlan:
        """The head's launch plan over `names` (workers started, tunnels open)."""
        ...

    def head_need(self, model_id: str) -> int | None:
        """Bytes this machine holds of the split (its last plan's), None before one was made."""
        ...


_LAUNCHER: SplitLauncher | None = None


def register(launcher: SplitLauncher | None) -> None:
    global _LAUNCHER
    _LAUNCHER = launcher


def registered() -> SplitLauncher | None:
    return _LAUNCHER


def split_of(settings: Settings, model_id: str) -> tuple[str, ...]:
    """The peers a model's overrides split it across (empty: not split)."""
    return peers_named(settings, model_id, "split")
