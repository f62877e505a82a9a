"""The Runtime: settings, paths, the event bus, the catalog and the supervisor, owned together.

`switchyard serve` runs it under plain asyncio; the GUI runs the same object under qasync.
It sits above `lanes` and below `server` in the import order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from types import TracebackType

from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.bandwidth import load_or_measure
from app.hardware.model import Hardware
from app.hardware.monitor import Monitor
from app.hardware.probe import probe
from app.hub.config import hub_config
from app.hub.download import DownloadManager
from app.hub.token import TokenStore
from app.lanes.engine_jobs import EngineJobs
from app.lanes.engine_store import EngineStore
from app.lanes.lane import Lane
from app.lanes.remote_store import RemoteStore
from app.lanes.remotes import RemoteRegistry
from app.lanes.supervisor import Supervisor
from app.library.catalog import Catalog
from app.library.footprints import LibraryFootprints
from app.library.store import Library

log = logging.getLogger("switchyard")


@dataclass
class Runtime:
    settings: Settings
    paths: Paths
    bus: EventBus = field(default_factory=EventBus)
    catalog: Catalog = field(init=False)
    supervisor: Supervisor = field(init=False)
    _monitor: Monitor | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.paths.ensure()
        dirs = self.settings.models_dirs or (self.paths.models,)
        # the library (library.db) is opened here and closed on exit; the catalog reads and records through it
        self.library = Library.open(self.paths)
        for notice in self.library.notices:
            log.warning("%s", notice)
        self.catalog = Catalog(dirs, library=self.library, hf_cache=hub_config(self.settings).cache_dir)
        self.catalog.scan()
        self.footprints = LibraryFootprints(self.library)
        self.supervisor = Supervisor(
            catalog=self.catalog,
            settings=self.settings,
            bus=self.bus,
            log_dir=self.paths.lane_logs,
            on_ready=self._lane_ready,
            pins_file=self.paths.pins_file,
        )
        # remote lanes (docs/engines.md#remote-lanes): remotes.json, their keys, their health checks
        self.remotes = RemoteRegistry(RemoteStore.at(self.paths.home), bus=self.bus, settings=self.settings)
        # engines in their own environments (`switchyard engine`, /api/engines): install jobs
        self.engines = EngineJobs(bus=self.bus, settings=self.settings, store=EngineStore(self.paths.engines))
        # one token store per process: it holds a session-only token that hub calls and downloads share
        self.tokens = TokenStore(self.paths, self.settings)
        # downloads (app/hub/download.py): jobs persist in SWITCHYARD_HOME/downloads and resume on start
        self.downloads = DownloadManager(
            settings=self.settings,
            bus=self.bus,
            state_dir=self.paths.home / "downloads",
            token=self.tokens.get,
            on_complete=self.library.mark_download,
        )

    def _lane_ready(self, lane: Lane) -> None:
        self.footprints.record(lane)
        self.library.touch(lane.model_id)  # last_used_at: when a lane was last started for the model

    async def __aenter__(self) -> Runtime:
        await self.supervisor.__aenter__()
        await self.downloads.__aenter__()
        await self.remotes.__aenter__()
        if self.settings.plan_memory:
            # once, off the event loop: NVML, sysfs and llama.cpp's device list
            self.supervisor.hardware = await asyncio.to_thread(probe, bandwidth_cache=None)
        if self.settings.monitor_interval_s > 0:
            self._monitor = Monitor(self.bus, interval=self.settings.monitor_interval_s)
            await self._monitor.__aenter__()
        return self

    @property
    def hardware(self) -> Hardware | None:
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

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._monitor is not None:
            await self._monitor.__aexit__(et, ev, tb)
            self._monitor = None
        await self.remotes.__aexit__(et, ev, tb)
        await self.engines.__aexit__(et, ev, tb)
        await self.downloads.__aexit__(et, ev, tb)
        await self.supervisor.__aexit__(et, ev, tb)
        self.library.close()
