"""The head side of a split lane: one GGUF run by this machine's llama-server over paired peers' RPC workers.

A model whose `model_overrides` name `split: [PEER, ...]` starts here as llama-server (this machine's RPC
build, app/lanes/peers/rpc.py) with `--rpc` pointing at local tunnel ends: each is a listener on 127.0.0.1
whose connections are carried, one WebSocket each, over the peer's mutual-TLS link to its worker. Before
anything starts, every worker's build is compared with this machine's (a mismatch is refused, naming both)
and the split is planned from each machine's own probe and budget and the GGUF's layout (app/fit/split.py):
explicit `--tensor-split` and `-ngl`, so no worker is asked for more than it lends.

Failures the engine itself handles badly are watched here:
- a worker that dies (or whose link drops) closes its WebSocket: every tunnel is cut at once, llama-server
  aborts, and the client's stream gets the gateway's error event;
- a stalled link (no byte from a worker while a request is in flight, `STALL_S`; or the WebSocket's own
  heartbeat unanswered) is cut the same way, since llama-server would wait forever while `/health` says ok.
The next request plans again (a fresh worker), or is refused with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from app.core.errors import EngineUnavailableError, PeerUnavailableError, SettingsError
from app.fit.lend import lend_budget
from app.lanes.engines.llamacpp import across
from app.lanes.peers import rpc

if TYPE_CHECKING:
    from app.fit.split import SplitMachine, SplitPlan
    from app.lanes.peers.registry import PeerRegistry

log = logging.getLogger("switchyard.peers.split")
STALL_S = float(os.environ.get("SWITCHYARD_SPLIT_STALL_S", "10"))  # silence while busy that counts as stalled
# the tunnel's WebSocket ping: one unanswered within half of it closes the link (a busy event loop on a
# loaded machine answered late with 2 s, cutting a healthy split)
HEARTBEAT_S = 6.0
IDLE_TEARDOWN_S = 5.0  # the head's RPC sockets all closed this long: the workers are stopped
PREPARE_S = 60.0
CUT_AFTER_S = 0.2  # the lane stops the head itself first, so the requests that break learn why
WORKER_PATH = "/peer/rpc"


@dataclass
class _Link:
    """One worker as the head reaches it: the peer's worker id and the local tunnel end."""

    peer: str
    worker_id: str
    build: str
    server: asyncio.AbstractServer | None = None
    port: int = 0
    conns: set[asyncio.StreamWriter] = field(default_factory=set)


@dataclass
class SplitSetup:
    """One started split: its plan, its links, and what watches them."""

    model_id: str
    plan: SplitPlan
    links: list[_Link]
    failure: str | None = None
    last_byte: float = field(default_factory=time.monotonic)
    busy_since: float | None = None
    ever_connected: bool = False
    idle_since: float | None = None
    watcher: asyncio.Task[None] | None = None
    closed: bool = False
    report: Callable[[str, str], None] | None = None  # tells the head's lane why it must stop

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{ln.port}" for ln in self.links]

    def fail(self, reason: str) -> None:
        """Stop the head: its lane is told first (`report`: it kills the engine, names `reason` to the
        requests that break, and starts again, planning afresh), then every tunnel is cut, which makes
        llama-server abort on its own where no lane is there to tell."""
        if self.failure is None:
            self.failure = reason
            log.warning("split %s stopped: %s", self.model_id, reason)
            if self.report is not None:
                self.report(self.model_id, reason)
        asyncio.get_running_loop().call_later(CUT_AFTER_S, self.cut)

    def cut(self) -> None:
        for link in self.links:
            for w in list(link.conns):
                w.transport.abort()


class SplitBroker:
    """Plans, starts, watches and stops this server's splits."""

    def __init__(
        self,
        peers: PeerRegistry,
        *,
        in_flight: Callable[[str], int] | None = None,
        unload: Callable[[str], Awaitable[Any]] | None = None,
        report: Callable[[str, str], None] | None = None,
    ) -> None:
        self.peers = peers
        self.loop = asyncio.get_running_loop()
        self.in_flight = in_flight or (lambda _m: 0)
        self.unload = unload  # stops a split's head first at a server stop (cut tunnels would crash it)
        self.report = report  # a split's failure, told to its head's lane (which restarts it)
        self._setups: dict[str, SplitSetup] = {}
        self._plans: dict[str, SplitPlan] = {}

    # ---- registration --------------------------------------------------------------------------------
    def register(self) -> None:
        """This broker starts split models from now on (the llama.cpp kind asks through `across`)."""
        across.register(self)

    async def close(self) -> None:
        if across.registered() is self:
            across.register(None)
        for model_id in list(self._setups):
            if self.unload is not None:  # the head frees its workers' buffers as it leaves: let it
                with contextlib.suppress(Exception):
                    await self.unload(model_id)
            await self.teardown(model_id)

    # ---- planning ------------------------------------------------------------------------------------
    async def machines(
        self, names: Sequence[str], *, head_budget: int, head_bandwidth: float | None
    ) -> tuple[SplitMachine, list[SplitMachine], dict[str, str]]:
        """This machine and each named peer as the planner sees them, and each one's RPC build; refuses a
        peer without an RPC build or with another build than this machine's, naming both."""
        from app.fit.split import SplitMachine

        folder = rpc.rpc_bin()
        if folder is None:
            raise EngineUnavailableError(
                f"a split model starts llama-server here, and {rpc.missing_build_advice()}"
            )
        own = await asyncio.to_thread(rpc.build_of, folder)
        builds = {"": own}
        workers: list[SplitMachine] = []
        for name in names:
            t0 = time.monotonic()
            info = await self.peers.ask(name, "GET", "/peer/info")
            rtt = time.monotonic() - t0
            offer = info.get("rpc") if isinstance(info, dict) else None
            if not isinstance(offer, dict) or not offer.get("available"):
                why = (
                    offer.get("why")
                    if isinstance(offer, dict)
                    else "it runs a Switchyard without split lanes"
                )
                raise EngineUnavailableError(f"peer {name!r} cannot lend an RPC worker: {why}")
            builds[name] = str(offer.get("build"))
            if builds[name] != own:
                raise EngineUnavailableError(
                    f"peer {name!r} runs llama.cpp RPC build {builds[name]!r}, this machine {own!r}: "
                    "llama.cpp refuses or misreads a worker of another build, so the split is not started; "
                    "build the same version on both (scripts/build-llama-rpc.sh)"
                )
            workers.append(
                SplitMachine(
                    name=name,
                    budget_bytes=int(offer.get("budget_bytes") or 0),
                    bandwidth=_bandwidth(info.get("hardware")),
                    rtt_s=rtt,
                )
            )
        head = SplitMachine(name="", budget_bytes=head_budget, bandwidth=head_bandwidth, rtt_s=0.0)
        return head, workers, builds

    def cached_plan(self, model_id: str) -> SplitPlan | None:
        return self._plans.get(model_id)

    def head_need(self, model_id: str) -> int | None:
        plan = self._plans.get(model_id)
        return plan.shares[0].total if plan is not None else None

    def launch_plan(self, entry: Any, settings: Any, start: Any, names: Sequence[str]) -> Any:
        return launch_plan(self, entry, settings, start, names)

    # ---- starting ------------------------------------------------------------------------------------
    def prepare_blocking(self, model_id: str, plan_of: Callable[..., Awaitable[SplitPlan]]) -> SplitSetup:
        """`prepare` from a lane's plan thread (the loop runs the work)."""
        fut = asyncio.run_coroutine_threadsafe(self.prepare(model_id, plan_of), self.loop)
        return fut.result(PREPARE_S)

    async def prepare(self, model_id: str, plan_of: Callable[..., Awaitable[SplitPlan]]) -> SplitSetup:
        """Plan (builds compared first), then a fresh worker on each peer and a tunnel end for each."""
        await self.teardown(model_id)  # a restart plans afresh: a worker that died is replaced
        plan = await plan_of(self)
        self._plans[model_id] = plan
        if not plan.fits:
            raise EngineUnavailableError(f"split of {model_id!r} does not fit: {plan.reason}")
        links: list[_Link] = []
        setup = SplitSetup(model_id=model_id, plan=plan, links=links, report=self.report)
        try:
            for share in plan.shares[1:]:
                doc = await self.peers.ask(share.machine, "POST", WORKER_PATH)
                links.append(_Link(peer=share.machine, worker_id=str(doc["id"]), build=str(doc.get("build"))))
            for link in links:
                link.server = await asyncio.start_server(self._carrier(setup, link), "127.0.0.1", 0)
                link.port = int(link.server.sockets[0].getsockname()[1])
        except BaseException:
            self._setups[model_id] = setup
            await self.teardown(model_id)
            raise
        self._setups[model_id] = setup
        setup.watcher = asyncio.create_task(self._watch(setup), name=f"split-watch:{model_id}")
        return setup

    async def _open_ws(self, link: _Link) -> aiohttp.ClientWebSocketResponse:
        remote = self.peers.remotes.get(link.peer)
        session = self.peers.session(link.peer)
        return await session.ws_connect(
            f"{remote.base}{WORKER_PATH}/{link.worker_id}/link",
            headers=remote.headers(),
            heartbeat=HEARTBEAT_S,
            max_msg_size=0,
            timeout=aiohttp.ClientWSTimeout(ws_close=2.0),
        )

    def _carrier(
        self, setup: SplitSetup, link: _Link
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._carry(setup, link, reader, writer)

        return carry

    async def _carry(
        self, setup: SplitSetup, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One RPC connection of the head: carried by a WebSocket of its own to the peer's worker."""
        if setup.failure is not None or setup.closed:
            writer.transport.abort()
            return
        try:
            ws = await self._open_ws(link)
        except (aiohttp.ClientError, OSError, TimeoutError, PeerUnavailableError) as exc:
            setup.fail(f"the link to peer {link.peer!r}'s RPC worker did not open ({exc})")
            writer.transport.abort()
            return
        link.conns.add(writer)
        setup.ever_connected, setup.idle_since = True, None
        setup.last_byte = time.monotonic()
        worker_ended = False

        async def up() -> None:  # head -> worker
            while True:
                data = await reader.read(rpc.CHUNK)
                if not data:
                    return
                await ws.send_bytes(data)

        async def down() -> None:  # worker -> head
            nonlocal worker_ended
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                setup.last_byte = time.monotonic()
                writer.write(msg.data)
                await writer.drain()
            worker_ended = True

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if worker_ended and not setup.closed:
                code = ws.close_code
                why = "its RPC worker ended" if code == 1011 else f"the link closed (WebSocket {code})"
                if ws.exception() is not None:
                    why = f"the link failed ({ws.exception()})"
                setup.fail(f"peer {link.peer!r}: {why}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            link.conns.discard(writer)
            writer.transport.abort()
            with contextlib.suppress(Exception):
                await ws.close()
            if not any(ln.conns for ln in setup.links):
                setup.idle_since = time.monotonic()

    async def _watch(self, setup: SplitSetup) -> None:
        """The stall rule and the idle teardown, twice a second."""
        while not setup.closed:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            busy = self.in_flight(setup.model_id) > 0
            if not busy:
                setup.busy_since = None
            elif setup.busy_since is None:
                setup.busy_since = now
            if busy and setup.busy_since is not None and any(ln.conns for ln in setup.links):
                silent = now - max(setup.last_byte, setup.busy_since)
                if silent > STALL_S:
                    peers = ", ".join(repr(ln.peer) for ln in setup.links)
                    setup.fail(
                        f"no byte from the RPC worker(s) on {peers} for {silent:.0f} s while a request was "
                        "in flight: the link stalled (llama-server would wait for ever), so the head was "
                        "stopped"
                    )
            if (
                setup.ever_connected
                and setup.idle_since is not None
                and now - setup.idle_since > IDLE_TEARDOWN_S
            ):
                # the head is gone (stopped, or aborted by a failure above): its workers are not needed
                await self.teardown(setup.model_id, setup=setup)
                return

    async def teardown(self, model_id: str, *, setup: SplitSetup | None = None) -> None:
        """Stop a split's tunnels and ask its peers to stop their workers (best effort: a peer may be off)."""
        current = self._setups.get(model_id)
        if setup is not None and current is not setup:
            return  # a newer start of the same model owns it now
        setup = self._setups.pop(model_id, None)
        if setup is None:
            return
        setup.closed = True
        if setup.watcher is not None and setup.watcher is not asyncio.current_task():
            setup.watcher.cancel()
        setup.cut()
        for link in setup.links:
            if link.server is not None:
                link.server.close()
            with contextlib.suppress(PeerUnavailableError, KeyError, SettingsError):
                await self.peers.ask(link.peer, "DELETE", f"{WORKER_PATH}/{link.worker_id}")

    def public(self) -> list[dict[str, Any]]:
        return [
            {
                "model": s.model_id,
                "workers": [
                    {"peer": ln.peer, "tunnel": f"127.0.0.1:{ln.port}", "connections": len(ln.conns)}
                    for ln in s.links
                ],
                "failure": s.failure,
                "plan": s.plan.public(),
            }
            for s in self._setups.values()
        ]


def _bandwidth(hardware: Any) -> float | None:
    if not isinstance(hardware, dict):
        return None
    band = hardware.get("bandwidth")  # the copy figure (reads plus writes), as app/fit/plan.py takes it
    value = band.get("all_cores") if isinstance(band, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


# ---- the launch plan ------------------------------------------------------------------------------------
async def plan_across(
    broker: SplitBroker, entry: Any, settings: Any, names: Sequence[str], *, hardware: Any
) -> SplitPlan:
    """The split plan of `entry` over this machine and `names` (builds compared first)."""
    from app.fit.split import plan_split
    from app.formats.gguf_layout import read_gguf_layout
    from app.formats.gguf_meta import GGUFProblem
    from app.lanes.engines.llamacpp.kind import fit_params

    layout = await asyncio.to_thread(read_gguf_layout, list(entry.parts) or [entry.path])
    if isinstance(layout, GGUFProblem):
        raise EngineUnavailableError(f"model {entry.id!r} cannot be split: {layout.reason}")
    band = getattr(hardware, "bandwidth", None)
    head, workers, _builds = await broker.machines(
        names,
        head_budget=lend_budget(settings, hardware),
        head_bandwidth=float(band.all_cores) if band is not None else None,
    )
    return plan_split(layout, params=fit_params(entry, settings), head=head, workers=workers)


def launch_plan(broker: SplitBroker, entry: Any, settings: Any, start: Any, names: Sequence[str]) -> Any:
    """llama-server of this machine's RPC build over the peers' workers (runs in the lane's plan thread)."""
    import dataclasses

    from app.lanes.engines.llamacpp.kind import llama_server_argv, plan_params
    from app.lanes.engines.plan import LaunchPlan
    from app.lanes.proc import settings_env

    folder = rpc.rpc_bin()
    if folder is None:
        raise EngineUnavailableError(
            f"model {entry.id!r} is split across peers, and {rpc.missing_build_advice()}"
        )

    async def plan_of(b: SplitBroker) -> SplitPlan:
        return await plan_across(b, entry, settings, names, hardware=start.hardware)

    setup = broker.prepare_blocking(entry.id, plan_of)
    plan = setup.plan
    params = dataclasses.replace(plan_params(entry, settings), gpu_layers=-1)
    if params.slot_save_path:  # llama-server wants the session bank's folder to exist
        Path(params.slot_save_path).mkdir(parents=True, exist_ok=True)
    argv = (
        *llama_server_argv(str(folder / rpc.HEAD), params, port=start.port, ppid=start.ppid),
        "--rpc",
        ",".join(setup.endpoints),
        *plan.engine_args(),
        "-lv",
        "4",  # this build logs its buffer sizes (the measured footprint, per machine) only at level 4
    )
    env = settings_env(settings, kind="llama.cpp")
    # a lost worker aborts llama-server: at once, not after a debugger prints its stack for seconds while
    # the dying head still takes requests
    env["GGML_NO_BACKTRACE"] = "1"
    lib = str(folder)
    env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else lib
    workers = ", ".join(f"{s.machine!r} {s.layers} layers" for s in plan.shares[1:])
    note = (
        f"split across peers: this machine {plan.shares[0].layers} layers, {workers}; llama.cpp RPC build "
        f"{rpc.build_of(folder)}, each worker reached only through its peer's mutual-TLS tunnel"
    )
    return LaunchPlan(
        runtime="llama-server",
        argv=argv,
        env=env,
        health_path="/health",
        port=start.port,
        params=params,
        fit=None,
        notes=(note,),
    )
