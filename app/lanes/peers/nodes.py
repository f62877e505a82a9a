"""The worker side of a multi-node vLLM or SGLang model: one engine process lent to a paired peer's head.

The head plans every machine's part (app/lanes/engines/multinode.py) and sends this machine its NodeLaunch
over the mutual-TLS link (`POST /peer/node`, app/server/admin/peers.py). Nothing is taken on the head's
word: before anything starts, this machine checks for itself that the network to that peer is marked
trusted in ITS own peers.json (the engines' traffic between machines is unencrypted, so both ends must
have said the link is theirs), that its own NVIDIA cards are there with the memory the part needs free now,
that the engine is installed here, and that the launch runs that engine on a model folder of its own
library with no variables beyond the plan's. Every refusal is named at once, with what to do.

A started part runs under the guard (so it dies with this server) until the peer stops it, unpairs, or this
server stops. `dry_run` returns the exact program, environment and budget without starting anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import BadRequestError, EngineUnavailableError, ModelNotFoundError
from app.core.platform.ports import free_loopback_port
from app.core.settings import Settings
from app.hardware.nvidia import read_nvidia
from app.lanes.engines.multinode import NodeCommand, NodeLaunch
from app.lanes.engines.multinode_part import launch_refusals, node_process, own_flags
from app.lanes.peers.store import PeerSpec
from app.lanes.proc import EngineProcess, LogRing

log = logging.getLogger("switchyard.peers.nodes")
NODE_PATH = "/peer/node"
STOP_GRACE_S = 5.0  # a moment to free cards and NCCL on SIGTERM, inside the head's call timeout (10 s)


def parse_launch(raw: dict[str, Any]) -> NodeLaunch:
    """The NodeLaunch a head sent in a /peer/node body; a clear 400 when it is not one."""
    try:
        return NodeLaunch.from_json(raw)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadRequestError(
            f"'launch' is not a NodeLaunch ({exc!r} is wrong or missing)", param="launch"
        ) from exc


def untrusted_refusal(peer: str) -> str:
    """Why a paired peer whose link this machine has not marked trusted gets no engine process here."""
    return (
        f"the network to {peer!r} is not marked as trusted on the machine asked: the engines send tensors "
        "between machines unencrypted and unauthenticated, so both ends must say the link is theirs; on a "
        f"network only you control, run `switchyard peers trust {peer} --network` on that machine too"
    )


@dataclass
class NodePart:
    """One engine process this machine runs for a peer's multi-node model."""

    id: str
    peer: str
    launch: NodeLaunch
    command: NodeCommand
    engine: EngineProcess
    started: float = field(default_factory=time.time)

    def public(self) -> dict[str, Any]:
        code = self.engine.proc.returncode
        return {
            "id": self.id,
            "peer": self.peer,
            "engine": self.launch.engine,
            "rank": self.launch.rank,
            "model_path": self.launch.model_path,
            "pid": self.engine.pid,
            "alive": code is None,
            "returncode": code,
            "port": self.command.port,
            "health_path": self.command.health_path,
            "budget": self.launch.budget,
            "started": self.started,
            "log_tail": self.engine.ring.tail(10),
        }


def dry_run(launch: NodeLaunch, command: NodeCommand, *, free: dict[int, int | None]) -> dict[str, Any]:
    """What a start would launch: the exact program and environment, and what its cards must hold."""
    return {
        "dry_run": True,
        "engine": launch.engine,
        "rank": launch.rank,
        "argv": list(command.argv),
        "env": dict(command.env),
        "port": command.port,
        "health_path": command.health_path,
        "budget": {
            "gpus": list(launch.gpus),
            "card_bytes": launch.card_bytes,
            "fraction": launch.fraction,
            "total": launch.budget,
            "free": {str(i): free.get(i) for i in launch.gpus},
        },
    }


class NodeParts:
    """This machine's engine processes lent to peers' multi-node models (one per peer and model folder)."""

    def __init__(self, *, logs: Path) -> None:
        self.logs = logs
        self._parts: dict[str, NodePart] = {}
        self._lock = asyncio.Lock()

    async def start(
        self,
        peer: PeerSpec,
        launch: NodeLaunch,
        *,
        settings: Settings,
        library: Collection[str],
        dry: bool = False,
    ) -> dict[str, Any]:
        """Check `launch` here (every refusal at once, as EngineUnavailableError), then start it under the
        guard, or with `dry` only say what would start. A part of the same peer on the same folder is
        stopped first: a head that starts again plans afresh."""
        scan = await asyncio.to_thread(read_nvidia)  # this machine's cards and their free memory, now
        reasons = [] if peer.trusted_network else [untrusted_refusal(peer.name)]
        reasons += launch_refusals(
            launch,
            library=library,
            gpus=scan.gpus,
            gpu_note=scan.reason,
            own_flags=own_flags(settings, launch.engine),
        )
        where = f"rank {launch.rank} of {launch.model_path!r} is not started for peer {peer.name!r}"
        if reasons:
            raise EngineUnavailableError(f"{where}: " + "; ".join(reasons))
        port = None if launch.health_path is None else free_loopback_port()
        try:
            command = node_process(launch, settings=settings, port=port, ppid=os.getpid())
        except EngineUnavailableError as exc:
            raise EngineUnavailableError(f"{where}: {exc.message}") from exc
        if dry:
            return dry_run(launch, command, free={g.index: g.memory_free for g in scan.gpus})
        async with self._lock:
            for old in [
                p
                for p in self._parts.values()
                if (p.peer, p.launch.model_path) == (peer.name, launch.model_path)
            ]:
                self._parts.pop(old.id, None)
                await _end(old)
            self.logs.mkdir(parents=True, exist_ok=True)
            ring = LogRing(max_lines=200, file=self.logs / f"node-{peer.name}-rank{launch.rank}.log")
            engine = await EngineProcess.spawn(
                command.argv, env=command.env, ring=ring, on_port=lambda _p: None
            )
            part = NodePart(
                id=secrets.token_hex(8), peer=peer.name, launch=launch, command=command, engine=engine
            )
            self._parts[part.id] = part
        log.info("rank %d of %s for peer %s (pid %d)", launch.rank, launch.model_path, peer.name, engine.pid)
        return part.public()

    def get(self, part_id: str, *, peer: str) -> NodePart:
        part = self._parts.get(part_id)
        if part is None or part.peer != peer:
            raise ModelNotFoundError(
                f"no multi-node part {part_id!r} runs here for peer {peer!r}; start one first"
            )
        return part

    async def stop(self, part_id: str, *, peer: str) -> None:
        part = self.get(part_id, peer=peer)
        self._parts.pop(part.id, None)
        await _end(part)

    async def stop_peer(self, peer: str) -> None:
        async with self._lock:
            for part in [p for p in self._parts.values() if p.peer == peer]:
                self._parts.pop(part.id, None)
                await _end(part)

    async def close(self) -> None:
        for part in list(self._parts.values()):
            await _end(part)
        self._parts.clear()

    def public(self, peer: str | None = None) -> list[dict[str, Any]]:
        return [p.public() for p in self._parts.values() if peer is None or p.peer == peer]


async def _end(part: NodePart) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):
        await part.engine.terminate(grace=STOP_GRACE_S)
    part.engine.ring.close()
