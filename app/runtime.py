"""The Runtime: settings, paths, the event bus, the catalog and the supervisor, owned together.

`switchyard serve` runs it under plain asyncio; the GUI runs the same object under qasync.
It sits above `lanes` and below `server` in the import order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType

from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.supervisor import Supervisor
from app.library.catalog import Catalog


@dataclass
class Runtime:
    settings: Settings
    paths: Paths
    bus: EventBus = field(default_factory=EventBus)
    catalog: Catalog = field(init=False)
    supervisor: Supervisor = field(init=False)

    def __post_init__(self) -> None:
        self.paths.ensure()
        dirs = self.settings.models_dirs or (self.paths.models,)
        self.catalog = Catalog(dirs)
        self.catalog.scan()
        self.supervisor = Supervisor(
            catalog=self.catalog, settings=self.settings, bus=self.bus, log_dir=self.paths.lane_logs
        )

    async def __aenter__(self) -> Runtime:
        await self.supervisor.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.supervisor.__aexit__(et, ev, tb)
