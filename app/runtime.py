"""The Runtime: settings, paths, the event bus, the catalog and the supervisor, owned together, and the verbs
that the server's routes, the GUI's pages and the commands ask of them.

`switchyard serve` runs it under plain asyncio; the GUI runs the same object under qasync. The constructor
does no I/O; `__aenter__` opens the library, scans and starts each part on one `AsyncExitStack`, so a part
that fails to start unwinds the ones already started. It sits above `lanes` and below `server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from app.advice.explain import Explanation, explain, pin_refusal
from app.advice.hub_fit import fit_detail
from app.advice.inputs import AdviceInputs, with_overrides
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.pins import PinStore
from app.core.settings import Settings
from app.hardware.bandwidth import load_or_measure
from app.hardware.model import Hardware
from app.hardware.monitor import Monitor
from app.hardware.probe import probe, read_memory
from app.hub.api import ModelDetail
from app.hub.download import DownloadManager
from app.hub.remote import RangeReader
from app.hub.token import TokenStore
from app.lanes.engine_jobs import EngineJobs
from app.lanes.engine_store import EngineStore
from app.lanes.lane import Lane
from app.lanes.remote_store import RemoteStore
from app.lanes.remotes import RemoteRegistry
from app.lanes.supervisor import Supervisor
from app.library.catalog import Catalog
from app.library.footprints import LibraryFootprints
from app.library.opening import open_catalog
from app.library.store import Library

log = logging.getLogger("switchyard")


class AsyncPart(Protocol):
    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None, /
    ) -> Any: ...


@dataclass
class Runtime:
    settings: Settings
    paths: Paths
    bus: EventBus = field(default_factory=EventBus)
    # made in the constructor (no I/O): the pins, remote lanes, engine installs and the hub token
    pins: PinStore = field(init=False)
    remotes: RemoteRegistry = field(init=False)
    engines: EngineJobs = field(init=False)
    tokens: TokenStore = field(init=False)
    # opened and started in __aenter__, in this order, and closed in reverse by the exit stack
    library: Library = field(init=False)
    catalog: Catalog = field(init=False)
    footprints: LibraryFootprints = field(init=False)
    supervisor: Supervisor = field(init=False)
    downloads: DownloadManager = field(init=False)
    _stack: contextlib.AsyncExitStack | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.pins = PinStore(self.paths.pins_file)
        # remote lanes (docs/engines.md#remote-lanes): remotes.json, their keys, their health checks
        self.remotes = RemoteRegistry(RemoteStore.at(self.paths.home), bus=self.bus, settings=self.settings)
        # engines in their own environments (`switchyard engine`, /api/engines): install jobs
        self.engines = EngineJobs(bus=self.bus, settings=self.settings, store=EngineStore(self.paths.engines))
        # one token store per process: it holds a session-only token that hub calls and downloads share
        self.tokens = TokenStore(self.paths, self.settings)

    def _lane_ready(self, lane: Lane) -> None:
        self.footprints.record(lane)
        self.library.touch(lane.model_id)  # last_used_at: when a lane was last started for the model

    async def __aenter__(self) -> Runtime:
        async with contextlib.AsyncExitStack() as stack:
            await self._start(stack)
            self._stack = stack.pop_all()  # started: __aexit__ closes it; a failure above unwound it
        return self

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        self.paths.ensure()
        # library.db is opened here and closed last; the catalog reads and records through it
        self.library, self.catalog = open_catalog(self.settings, self.paths, notice=_log_notice)
        stack.callback(self.library.close)
        await asyncio.to_thread(self.catalog.scan)  # reads model headers: off the event loop
        self.footprints = LibraryFootprints(self.library)
        self.supervisor = Supervisor(
            catalog=self.catalog,
            settings=self.settings,
            bus=self.bus,
            log_dir=self.paths.lane_logs,
            on_ready=self._lane_ready,
            pins=self.pins,
        )
        await _enter(stack, self.supervisor)
        # downloads (app/hub/download.py): jobs persist in SWITCHYARD_HOME/downloads and resume on start
        self.downloads = DownloadManager(
            settings=self.settings,
            bus=self.bus,
            state_dir=self.paths.home / "downloads",
            token=self.tokens.get,
            on_complete=self.library.mark_download,
        )
        await _enter(stack, self.downloads)
        await _enter(stack, self.engines)
        await _enter(stack, self.remotes)
        if self.settings.plan_memory:
            # once, off the event loop: NVML, sysfs and llama.cpp's device list
            self.supervisor.hardware = await asyncio.to_thread(probe, bandwidth_cache=None)
        if self.settings.monitor_interval_s > 0:
            await _enter(stack, Monitor(self.bus, interval=self.settings.monitor_interval_s))

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(et, ev, tb)

    # ---- hardware ----------------------------------------------------------------------------------
    @property
    def hardware(self) -> Hardware | None:
        """The snapshot probed at start (None with plan_memory off, or before start)."""
        return self.supervisor.hardware

    async def hardware_with_bandwidth(self) -> Hardware:
        """The snapshot plus memory bandwidth (measured once per machine, cached in SWITCHYARD_HOME)."""
        hw: Hardware
        if self.supervisor.hardware is not None:
            hw = self.supervisor.hardware
        else:
            hw = await asyncio.to_thread(probe, bandwidth_cache=None)
        if hw.bandwidth is None:
            bw = await asyncio.to_thread(load_or_measure, self.paths.home / "hardware.json")
            hw = dataclasses.replace(hw, bandwidth=bw)
            if self.supervisor.hardware is not None:
                self.supervisor.hardware = hw
        return hw

    async def hardware_now(self) -> Hardware:
        """The snapshot with bandwidth, and the memory free read just now."""
        hw = await self.hardware_with_bandwidth()
        return dataclasses.replace(hw, memory=read_memory())

    # ---- advice (app/advice): the verdicts every page, route and command shows ---------------------
    def _inputs(
        self, hardware: Hardware, *, settings: Settings | None = None, exclude: str | None = None
    ) -> AdviceInputs:
        return AdviceInputs(
            settings=settings or self.settings,
            hardware=hardware,
            pins=self.pins.all(),
            used=self.supervisor.gpu_used(exclude=exclude),
        )

    async def explain(self, model_id: str, overrides: Mapping[str, Any] | None = None) -> Explanation:
        """The routing decision and memory plan beside what is loaded now and its last measured footprint;
        `overrides` (ctx_size, parallel, kv_type, gpu_layers) win over the model's saved ones.
        ModelNotFoundError for an unknown id."""
        entry = self.catalog.get(model_id, allow_broken=True)
        settings = with_overrides(self.settings, model_id, overrides)
        inputs = self._inputs(await self.hardware_now(), settings=settings, exclude=model_id)
        lane = self.supervisor.lanes.get(model_id)
        snapshot = lane.snapshot() if lane else None
        recorded = self.footprints.get(model_id, path=entry.path)
        return await asyncio.to_thread(explain, entry, inputs=inputs, lane=snapshot, recorded=recorded)

    def explain_brief(self, model_id: str) -> Explanation | None:
        """For listings, from any thread: the decision and plan on the start-up snapshot (no bandwidth
        measured, nothing about the loaded lane); None before the hardware is probed."""
        hw = self.hardware
        if hw is None:
            return None
        entry = self.catalog.get(model_id, allow_broken=True)
        inputs = self._inputs(dataclasses.replace(hw, memory=read_memory()), exclude=model_id)
        return explain(entry, inputs=inputs)

    async def fit_hub_model(
        self, detail: ModelDetail, *, reader: RangeReader, only: str | None = None
    ) -> ModelDetail:
        """Fill `detail.fit` with a verdict per quantization (or only the one named `only`) on this machine,
        beside what the loaded lanes hold."""
        inputs = self._inputs(await self.hardware_now())
        return await asyncio.to_thread(fit_detail, detail, reader=reader, inputs=inputs, only=only)

    async def check_pin(self, model_id: str, lane: str) -> str | None:
        """Why `lane` cannot run `model_id` here (None: the pin is fine); nothing is pinned."""
        entry = self.catalog.get(model_id, allow_broken=True)
        hw = self.hardware
        if hw is None:  # plan_memory off: probed now, without the engine's device list
            hw = await asyncio.to_thread(probe, engine=False)
        return await asyncio.to_thread(pin_refusal, entry, lane, settings=self.settings, hardware=hw)


async def _enter(stack: contextlib.AsyncExitStack, part: AsyncPart) -> None:
    # its exit is pushed first, so a part that fails half-way through its own start (a session opened, a
    # file unreadable) is closed too; every part's __aexit__ copes with a start cut short
    stack.push_async_exit(part)
    await part.__aenter__()


def _log_notice(notice: str) -> None:
    log.warning("%s", notice)
