"""The head side of a multi-node vLLM or SGLang model: this machine's engine process over paired peers' ones.

A safetensors model whose `model_overrides` (or load body) name `nodes: [PEER, ...]` starts here. The broker
reads each peer's own probe and library (`/peer/info`), plans every machine's part with plan_multinode
(this machine is rank 0, the head, and serves the API), asks each peer to start its part (`POST /peer/node`,
which checks everything again on that machine), and only then hands the head's process to its lane. A part
that a peer refuses or fails to start stops the parts already started, and the refusal names that peer.
The parts are stopped when the head's lane stops (unloaded, failed, or the server stopping), and a part
that dies stops the head (its lane is told, and restarts planning afresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.core.errors import EngineUnavailableError, SettingsError, SwitchyardError
from app.formats.safetensors_meta import SafetensorsModel
from app.lanes.engines import multinode, multinode_part, nodes_seam
from app.lanes.engines.multinode import MultiNodePlan, Node
from app.lanes.peers.nodes import NODE_PATH

if TYPE_CHECKING:
    from app.core.settings import Settings
    from app.hardware.model import Hardware
    from app.lanes.engines.plan import LaunchPlan, StartContext
    from app.lanes.peers.registry import PeerRegistry
    from app.library.model import ModelEntry

log = logging.getLogger("switchyard.peers.multihead")
HEAD = "this machine"  # the head's name in a plan (a peer's name is one word: it cannot be this)
PREPARE_S = 90.0
WATCH_S = 2.0  # how often the head's lane and the peers' parts are looked at


@dataclass
class NodeSetup:
    """One started multi-node model: its plan and the part each peer runs."""

    model_id: str
    plan: MultiNodePlan
    parts: dict[str, str] = field(default_factory=dict)  # peer name -> its part's id there
    watcher: asyncio.Task[None] | None = None
    failure: str | None = None


def engine_for(lane: str | None) -> str:
    """The multi-node engine for a model routing chose `lane` for: that one if it runs across machines,
    else the first that does."""
    return lane if lane is not None and lane in multinode.TITLES else next(iter(multinode.TITLES))


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).hostname or ""


def address_toward(host: str) -> str:
    """This machine's address on the route to `host` (where that peer reaches the head's rendezvous
    port); a UDP connect sends nothing, it only picks the route."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


class NodeBroker:
    """Plans, starts, watches and stops the multi-node models this server heads."""

    def __init__(
        self,
        peers: PeerRegistry,
        *,
        alive: Callable[[str], bool] | None = None,
        unload: Callable[[str], Awaitable[Any]] | None = None,
        report: Callable[[str, str], None] | None = None,
    ) -> None:
        self.peers = peers
        self.loop = asyncio.get_running_loop()
        self.alive = alive or (lambda _m: True)  # whether a model's head lane is starting or ready
        self.unload = unload
        self.report = report  # a part that died, told to the head's lane (which stops and restarts)
        self._setups: dict[str, NodeSetup] = {}

    def register(self) -> None:
        """This broker starts models that name `nodes` from now on (the cuda kinds ask nodes_seam)."""
        nodes_seam.register(self)

    async def close(self) -> None:
        if nodes_seam.registered() is self:
            nodes_seam.register(None)
        for model_id in list(self._setups):
            if self.unload is not None:  # the head first: its peers' parts would only wait for it
                with contextlib.suppress(Exception):
                    await self.unload(model_id)
            await self.teardown(model_id)

    # ---- planning ------------------------------------------------------------------------------------
    async def nodes(
        self, entry: ModelEntry, names: Sequence[str], *, hardware: Hardware | None, promised: int
    ) -> list[Node]:
        """This machine and each named peer as the plan sees them: the peers' own probes and the folder
        each keeps the same model in (its library, by the model's id)."""
        if not names:
            raise SettingsError('name the paired peers to run across, e.g. nodes: ["desk"]')
        found: list[Node] = []
        for name in names:
            spec = self.peers.get(name)
            info = await self.peers.ask(name, "GET", "/peer/info")
            models = info.get("models") if isinstance(info, dict) else None
            path = next(
                (m.get("path") for m in models or [] if isinstance(m, dict) and m.get("id") == entry.id), None
            )
            if not isinstance(path, str) or not path:
                raise EngineUnavailableError(
                    f"peer {name!r} has no model {entry.id!r} in its library (or runs a Switchyard that does "
                    "not say where it keeps it): every machine of a multi-node model needs the same model "
                    "files; pull it there first"
                )
            found.append(
                multinode.node_of_peer(
                    name,
                    address=_host(spec.url),
                    hardware=info.get("hardware"),
                    trusted_network=spec.trusted_network,
                    model_path=path,
                )
            )
        head = Node(
            name=HEAD,
            address=address_toward(found[0].address),
            gpus=hardware.gpus if hardware is not None else None,
            model_path=str(entry.path),
            trusted_network=True,  # the trust asked is of the links to the head
            promised=promised,
        )
        return [head, *found]

    async def plan(
        self,
        entry: ModelEntry,
        settings: Settings,
        names: Sequence[str],
        *,
        engine: str,
        hardware: Hardware | None,
        promised: int = 0,
    ) -> MultiNodePlan:
        """The multi-node plan of `entry` on `engine` over this machine and `names` (MultiNodeRefused
        lists every reason it cannot run)."""
        facts = entry.model_format().facts
        if not isinstance(facts, SafetensorsModel):
            raise EngineUnavailableError(
                f"{entry.id!r} is not a safetensors model folder: only those run on vLLM or SGLang "
                "across machines"
            )
        nodes = await self.nodes(entry, names, hardware=hardware, promised=promised)
        return multinode.plan_multinode(
            facts, engine=engine, model_id=entry.id, nodes=nodes, settings=settings
        )

    async def dry_runs(self, plan: MultiNodePlan) -> list[dict[str, Any]]:
        """Each peer's own check of its part, nothing started: what it would run, or why it will not."""
        out = []
        for launch in plan.nodes[1:]:
            try:
                doc = await self.peers.ask(
                    launch.node, "POST", NODE_PATH, {"launch": launch.public(), "dry_run": True}
                )
                out.append({"peer": launch.node, **doc})
            except SwitchyardError as exc:
                out.append({"peer": launch.node, "refused": exc.message})
        return out

    # ---- starting ------------------------------------------------------------------------------------
    def launch_plan(
        self, entry: ModelEntry, settings: Settings, start: StartContext, names: Sequence[str], *, engine: str
    ) -> LaunchPlan:
        """From a lane's plan thread: every peer's part started, then the head's own launch plan."""
        fut = asyncio.run_coroutine_threadsafe(
            self.prepare(entry, settings, start, names, engine=engine), self.loop
        )
        return fut.result(PREPARE_S)

    async def prepare(
        self, entry: ModelEntry, settings: Settings, start: StartContext, names: Sequence[str], *, engine: str
    ) -> LaunchPlan:
        await self.teardown(entry.id)  # a restart plans afresh
        used = start.used or {}
        promised = max((v for k, v in used.items() if k.startswith("GPU")), default=0)
        plan = await self.plan(
            entry, settings, names, engine=engine, hardware=start.hardware, promised=promised
        )
        # this machine's own program first: no peer's part is started for a head that cannot start
        head = multinode_part.head_plan(plan, settings=settings, port=start.port, ppid=start.ppid)
        setup = NodeSetup(model_id=entry.id, plan=plan)
        self._setups[entry.id] = setup
        for launch in plan.nodes[1:]:
            try:
                doc = await self.peers.ask(launch.node, "POST", NODE_PATH, {"launch": launch.public()})
            except SwitchyardError as exc:
                stopped = list(setup.parts)
                await self.teardown(entry.id)
                also = f"; stopped the parts already started on {', '.join(stopped)}" if stopped else ""
                raise EngineUnavailableError(
                    f"cannot start {entry.id!r} across {', '.join(names)}: peer {launch.node!r} did not "
                    f"start rank {launch.rank}: {exc.message}{also}"
                ) from exc
            setup.parts[launch.node] = str(doc["id"])
        setup.watcher = asyncio.create_task(self._watch(setup), name=f"nodes-watch:{entry.id}")
        return head

    async def _watch(self, setup: NodeSetup) -> None:
        """The head's lane gone: the peers' parts stop. A peer's part gone: its lane is told (it stops the
        head and starts again, planning afresh)."""
        while self._setups.get(setup.model_id) is setup:
            await asyncio.sleep(WATCH_S)
            if not self.alive(setup.model_id):
                await self.teardown(setup.model_id, setup=setup)
                return
            for peer, part in setup.parts.items():
                with contextlib.suppress(SwitchyardError):
                    doc = await self.peers.ask(peer, "GET", f"{NODE_PATH}/{part}")
                    if isinstance(doc, dict) and doc.get("alive") is False and setup.failure is None:
                        code = doc.get("returncode")
                        setup.failure = f"peer {peer!r}'s part (rank {doc.get('rank')}) exited with {code}"
                        log.warning("multi-node %s: %s", setup.model_id, setup.failure)
                        if self.report is not None:
                            self.report(setup.model_id, setup.failure)

    async def teardown(self, model_id: str, *, setup: NodeSetup | None = None) -> None:
        """Ask each peer to stop its part (best effort: a peer may be off)."""
        current = self._setups.get(model_id)
        if current is None or (setup is not None and current is not setup):
            return
        self._setups.pop(model_id, None)
        if current.watcher is not None and current.watcher is not asyncio.current_task():
            current.watcher.cancel()
        for peer, part in current.parts.items():
            with contextlib.suppress(SwitchyardError, KeyError):
                await self.peers.ask(peer, "DELETE", f"{NODE_PATH}/{part}")

    def public(self) -> list[dict[str, Any]]:
        return [
            {"model": s.model_id, "parts": dict(s.parts), "failure": s.failure, "plan": s.plan.public()}
            for s in self._setups.values()
        ]
