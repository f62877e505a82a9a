"""The Runtime: settings, paths, the event bus, the catalog and the supervisor, owned together.

`switchyard serve` runs it under plain asyncio; the GUI runs the same object under qasync.
It sits above `lanes` and below `server` in the import order.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from types import TracebackType

from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.bandwidth import load_or_measure
from app.hardware.model import Hardware
from app.hardware.monitor import Monitor
from app.hardware.probe import probe
from app.lanes.footprint import FootprintStore
from app.lanes.supervisor import Supervisor
from app.library.catalog import Catalog


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
        self.catalog = Catalog(dirs)
        self.catalog.scan()
        self.footprints = FootprintStore(self.paths.footprints_file)
        self.supervisor = Supervisor(
            catalog=self.catalog,
            settings=self.settings,
            bus=self.bus,
            log_dir=self.paths.lane_logs,
            on_ready=self.footprints.record,
            pins_file=self.paths.pins_file,
        )

    async def __aenter__(self) -> Runtime:
        await self.supervisor.__aenter__()
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
        await self.supervisor.__aexit__(et, ev, tb)
