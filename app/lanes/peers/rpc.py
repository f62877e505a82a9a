"""The worker side of a split lane: llama.cpp's `ggml-rpc-server` lent to a paired peer, through a tunnel.

The RPC protocol has no authentication: whoever reaches a worker can read and write its memory. So a worker
listens on 127.0.0.1 only, and the one way in is a WebSocket on this server's mutual-TLS port
(`/peer/rpc/{id}/link`, for the paired peer that asked for it: app/server/admin/peers.py), whose bytes are
copied to and from the worker's loopback socket. One worker per asking peer (an rpc-server serves one head
at a time); it lives until that peer stops it, unpairs, or this server stops, and the engine dies with this
server (the guard, as for any engine).

The build: llama.cpp refuses a worker of another RPC protocol only once the head is already loading, and
a build from a source package embeds no build number, so each binary folder names its build in a `BUILD`
file (scripts/build-llama-rpc.sh writes it), else the first line of `llama-server --version` stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineUnavailableError, ModelNotFoundError
from app.core.frozen import module_argv
from app.core.platform.ports import free_loopback_port
from app.hardware.cpu import usable_cores
from app.lanes.proc import EngineProcess, LogRing, engine_env

log = logging.getLogger("switchyard.peers.rpc")
BIN_ENV = "SWITCHYARD_RPC_BIN"  # a folder holding ggml-rpc-server and llama-server of one build
WORKER = "ggml-rpc-server"
HEAD = "llama-server"
CHUNK = 1 << 16
READY_S = 10.0


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("SWITCHYARD_RPC_CACHE") or Path(base) / "switchyard-rpc")


def rpc_bin() -> Path | None:
    """The folder of this machine's RPC build: SWITCHYARD_RPC_BIN, else the newest cached build."""
    named = os.environ.get(BIN_ENV)
    if named:
        folder = Path(named)
        return folder if (folder / WORKER).is_file() and (folder / HEAD).is_file() else None
    found = sorted(cache_root().glob("bin-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((f for f in found if (f / WORKER).is_file() and (f / HEAD).is_file()), None)


def missing_build_advice() -> str:
    return (
        "this machine has no llama.cpp RPC build (ggml-rpc-server and llama-server built with GGML_RPC): run "
        f"scripts/build-llama-rpc.sh once (about 30 minutes on two cores, cached), or set {BIN_ENV} to a "
        "folder holding both"
    )


def build_of(folder: Path) -> str:
    """The build a folder's binaries are: its BUILD file, else what llama-server says of itself."""
    stamp = folder / "BUILD"
    if stamp.is_file():
        return stamp.read_text(encoding="utf-8").strip()
    try:
        done = subprocess.run(
            [str(folder / HEAD), "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [
        ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip().startswith("version")
    ]
    return lines[0] if lines else "unknown"


@dataclass
class Worker:
    id: str
    peer: str
    port: int
    build: str
    engine: EngineProcess
    started: float = field(default_factory=time.time)
    links: int = 0  # tunnels open now (one head at a time)

    def public(self) -> dict[str, Any]:
        alive = self.engine.proc.returncode is None
        return {
            "id": self.id,
            "peer": self.peer,
            "build": self.build,
            "pid": self.engine.pid,
            "alive": alive,
            "links": self.links,
            "listens": f"127.0.0.1:{self.port}",
        }


class RpcWorkers:
    """This machine's rpc-servers, one per peer that asked."""

    def __init__(self, *, logs: Path) -> None:
        self.logs = logs
        self._workers: dict[str, Worker] = {}
        self._lock = asyncio.Lock()

    def offer(self) -> dict[str, Any]:
        """What /peer/info says of this machine's RPC build (the head compares builds before planning)."""
        folder = rpc_bin()
        if folder is None:
            return {"available": False, "why": missing_build_advice()}
        return {"available": True, "build": build_of(folder)}

    async def start(self, peer: str, *, threads: int = 0) -> Worker:
        """A fresh rpc-server for `peer` (any earlier one of its is stopped: a head reloads from scratch),
        computing on `threads` CPU threads (0: the cores this process may use, as for any engine)."""
        folder = rpc_bin()
        if folder is None:
            raise EngineUnavailableError(missing_build_advice())
        async with self._lock:
            await self._stop_of(peer)
            port = free_loopback_port()
            threads = threads or usable_cores()
            argv = (
                *module_argv("app.lanes.guard"),
                str(os.getpid()),
                "--",
                str(folder / WORKER),
                "--host",
                "127.0.0.1",  # never another address: the tunnel is the only way in
                "--port",
                str(port),
                "--threads",
                str(threads),
            )
            self.logs.mkdir(parents=True, exist_ok=True)
            ring = LogRing(max_lines=200, file=self.logs / f"rpc-{peer}.log")
            env = engine_env()
            env["GGML_NO_BACKTRACE"] = "1"  # no debugger run on an abort: the worker ends at once
            lib = str(folder)
            env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else lib
            engine = await EngineProcess.spawn(argv, env=env, ring=ring, on_port=lambda _p: None)
            worker = Worker(
                id=secrets.token_hex(8),
                peer=peer,
                port=port,
                build=await asyncio.to_thread(build_of, folder),
                engine=engine,
            )
            try:
                await _wait_listening(worker)
            except EngineUnavailableError:
                await _end(worker)
                raise
            self._workers[worker.id] = worker
            log.info("rpc-server for peer %s on 127.0.0.1:%d (pid %d)", peer, port, engine.pid)
            return worker

    def get(self, worker_id: str, *, peer: str) -> Worker:
        worker = self._workers.get(worker_id)
        if worker is None or worker.peer != peer:
            raise ModelNotFoundError(
                f"no RPC worker {worker_id!r} runs here for peer {peer!r}; start one first"
            )
        return worker

    def of_peer(self, peer: str) -> list[Worker]:
        return [w for w in self._workers.values() if w.peer == peer]

    async def stop(self, worker_id: str, *, peer: str) -> None:
        worker = self.get(worker_id, peer=peer)
        self._workers.pop(worker.id, None)
        await _end(worker)

    async def _stop_of(self, peer: str) -> None:
        for worker in self.of_peer(peer):
            self._workers.pop(worker.id, None)
            await _end(worker)

    async def stop_peer(self, peer: str) -> None:
        async with self._lock:
            await self._stop_of(peer)

    async def close(self) -> None:
        for worker in list(self._workers.values()):
            await _end(worker)
        self._workers.clear()

    def public(self) -> list[dict[str, Any]]:
        return [w.public() for w in self._workers.values()]


async def _wait_listening(worker: Worker) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if worker.engine.proc.returncode is not None:
            tail = " | ".join(worker.engine.ring.tail(5))
            raise EngineUnavailableError(
                f"ggml-rpc-server exited with {worker.engine.proc.returncode}: {tail}"
            )
        with contextlib.suppress(OSError):
            _r, w = await asyncio.open_connection("127.0.0.1", worker.port)
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()
            # a bare connect-and-close is a client the rpc-server serves and drops: it listens
            return
        await asyncio.sleep(0.1)
    raise EngineUnavailableError(
        f"ggml-rpc-server did not listen on 127.0.0.1:{worker.port} within {READY_S:.0f} s"
    )


async def _end(worker: Worker) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):
        await worker.engine.terminate(grace=2.0)
    worker.engine.ring.close()


async def bridge(worker: Worker, ws: Any) -> None:
    """Copy bytes between a peer's WebSocket (binary frames) and the worker's loopback socket until either
    side ends; the worker's death closes the WebSocket, which the head's tunnel reports at once."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
    except OSError as exc:
        await ws.close(code=1011, message=f"the RPC worker does not answer: {exc}".encode())
        return
    worker.links += 1

    async def up() -> None:  # head -> worker
        async for msg in ws:
            if msg.type.name != "BINARY":
                break
            writer.write(msg.data)
            await writer.drain()

    async def down() -> None:  # worker -> head
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            await ws.send_bytes(data)

    async def died() -> None:
        await worker.engine.proc.wait()

    tasks = [asyncio.create_task(c) for c in (up(), down(), died())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        worker.links -= 1
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
        with contextlib.suppress(Exception):
            await ws.close(code=1011 if worker.engine.proc.returncode is not None else 1000)
