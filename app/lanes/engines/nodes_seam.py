"""The seam between the vLLM and SGLang kinds and a model run across paired machines (app/lanes/peers/
multihead.py). A model whose overrides name `nodes: [PEER, ...]` is started by whoever registered here (the
running server's NodeBroker, which owns the peers); the kinds ask this module, so the engines never import
the peers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.library.model import ModelEntry


class NodesLauncher(Protocol):
    """The running server's node broker (app/lanes/peers/multihead.py): it owns the peers, so the engines
    never import them."""

    def launch_plan(
        self, entry: ModelEntry, settings: Settings, start: StartContext, names: Sequence[str], *, engine: str
    ) -> LaunchPlan:
        """The head's launch plan over `names`, every peer's part started."""
        ...


_LAUNCHER: NodesLauncher | None = None


def register(launcher: NodesLauncher | None) -> None:
    global _LAUNCHER
    _LAUNCHER = launcher


def registered() -> NodesLauncher | None:
    return _LAUNCHER


def nodes_of(settings: Settings, model_id: str) -> tuple[str, ...]:
    """The peers a model's overrides run it across with this machine (`nodes`; empty: this machine)."""
    return peers_named(settings, model_id, "nodes")


def peers_named(settings: Settings, model_id: str, key: str) -> tuple[str, ...]:
    """The peer names a model's override `key` holds (`nodes`, a llama.cpp `split`): a list, or one
    comma-separated string; empty when unset."""
    names: Any = settings.override(model_id, key, None)
    if not names:
        return ()
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    return tuple(str(n) for n in names)


def launch_across(
    engine: str, entry: ModelEntry, settings: Settings, start: StartContext, names: Sequence[str]
) -> LaunchPlan:
    """The cuda kinds' start of a model whose overrides name `nodes`: whoever registered plans and starts
    every machine's part; without one (no server with peers), refused saying so."""
    launcher = _LAUNCHER
    if launcher is None:
        raise EngineUnavailableError(
            f"{entry.id!r} runs across {', '.join(names)} (its `nodes`), and only a running "
            "`switchyard serve --tls` with those peers paired starts a model across machines"
        )
    return launcher.launch_plan(entry, settings, start, names, engine=engine)
