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

from app.advice.explain import Explanation, explain, pin_refusal, speed_device
from app.advice.hub_fit import fit_detail
from app.advice.inputs import AdviceInputs, with_overrides
from app.core.errors import BadRequestError, SettingsError, SwitchyardError
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.pins import PinStore
from app.core.settings import LOAD_KEYS, Settings, check_overrides, settings_from_mapping
from app.core.settings_live import SERVER_KEYS, SettingsChange, changed_keys, lane_inputs, not_wired
from app.fit.plan import device_bandwidths
from app.hardware.bandwidth import load_or_measure
from app.hardware.model import Hardware
from app.hardware.monitor import Monitor
from app.hardware.probe import probe, read_memory
from app.hub.api import ModelDetail
from app.hub.browse import Hub
from app.hub.config import hub_config
from app.hub.download import DownloadManager
from app.hub.range_reader import RangeReader
from app.hub.token import TokenStore
from app.lanes.engines.registry import calibrating_lanes
from app.lanes.install.jobs import EngineJobs
from app.lanes.install.store import EngineStore
from app.lanes.lane import Lane, LaneState
from app.lanes.remote.registry import RemoteRegistry
from app.lanes.remote.store import RemoteStore
from app.lanes.smoke import SmokeTests
from app.lanes.supervisor import Supervisor
from app.library.app_stores import app_stores
from app.library.catalog import Catalog
from app.library.footprints import LibraryFootprints
from app.library.opening import open_catalog
from app.library.speeds import LoadKey, SpeedRecorder, SpeedStore
from app.library.store import Library

log = logging.getLogger("switchyard")
# settings that change which folders hold models: the catalog rescans when one changes
RESCAN_KEYS = frozenset({"models_dirs", "hf_cache_dir", "app_stores", "app_store_paths", "shared_model_dirs"})


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
    hub: Hub = field(init=False)  # the one hub client of this process: the admin API's and the window's
    # opened and started in __aenter__, in this order, and closed in reverse by the exit stack
    library: Library = field(init=False)
    catalog: Catalog = field(init=False)
    footprints: LibraryFootprints = field(init=False)
    speeds: SpeedRecorder = field(init=False)  # measured tokens/s per model (the gateway feeds it)
    supervisor: Supervisor = field(init=False)
    smoke: SmokeTests = field(init=False)  # a model's first ready lane on its files: one short request
    downloads: DownloadManager = field(init=False)
    _stack: contextlib.AsyncExitStack | None = field(init=False, default=None)
    _applying: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.pins = PinStore(self.paths.pins_file)
        # remote lanes (docs/engines.md#remote-lanes): remotes.json, their keys, their health checks
        self.remotes = RemoteRegistry(RemoteStore.at(self.paths.home), bus=self.bus, settings=self.settings)
        # engines in their own environments (`switchyard engine`, /api/engines): install jobs
        self.engines = EngineJobs(bus=self.bus, settings=self.settings, store=EngineStore(self.paths.engines))
        # one token store per process: it holds a session-only token that hub calls and downloads share
        self.tokens = TokenStore(self.paths, self.settings)
        self.hub = Hub(self.paths, self.settings, tokens=self.tokens)

    def _load_key(self, model_id: str) -> LoadKey | None:
        """Where `model_id` runs now, for its measured speed (None: no planned local lane): "CPU", "GPU"
        (fully offloaded) or "GPU+CPU" (split), so a split load's answers teach neither device's factor."""
        lane = self.supervisor.lanes.get(model_id)
        if lane is None or lane.plan is None:
            return None
        chosen = lane.plan.fit.chosen if lane.plan.fit is not None else None
        device = "CPU" if chosen is None else speed_device(chosen)
        return LoadKey(lane.plan.engine, device, chosen.bytes_per_token if chosen else None, lane.plan)

    def _lane_ready(self, lane: Lane) -> None:
        self.footprints.record(lane)
        self.library.touch(lane.model_id)  # last_used_at: when a lane was last started for the model
        self.smoke.after_ready(lane)  # in the background, once per model files (app/lanes/smoke.py)

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
        self.speeds = SpeedRecorder(
            SpeedStore(self.library, calibrating=calibrating_lanes()), where=self._load_key
        )
        stack.push_async_callback(self.speeds.drain)  # answers still batched are filed before the close
        self.supervisor = Supervisor(
            catalog=self.catalog,
            settings=self.settings,
            bus=self.bus,
            log_dir=self.paths.lane_logs,
            on_ready=self._lane_ready,
            pins=self.pins,
        )
        self.smoke = SmokeTests(
            library=self.library, catalog=self.catalog, supervisor=self.supervisor, bus=self.bus
        )
        await _enter(stack, self.supervisor)
        await _enter(stack, self.smoke)  # left first: its requests end before the lanes close
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
        if self.settings.memory.plan_memory:
            # once, off the event loop: NVML, sysfs and llama.cpp's device list
            self.supervisor.hardware = await asyncio.to_thread(probe, bandwidth_cache=None)
        if self.settings.memory.monitor_interval_s > 0:
            await _enter(stack, Monitor(self.bus, interval=self.settings.memory.monitor_interval_s))

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(et, ev, tb)

    # ---- lanes: what the window asks (never the supervisor's own dict) ----------------------------------
    def lane_of(self, model_id: str) -> Lane | None:
        """The lane that runs `model_id` now (any state), or None when it has none yet."""
        return self.supervisor.lanes.get(model_id)

    async def forget_lane(self, model_id: str) -> None:
        """After `model_id` left the library: its (stopped) lane goes too, from `ps` and every view."""
        await self.supervisor.forget(model_id)

    def live_lanes(self) -> list[Lane]:
        """Lanes that are loading or ready."""
        return [
            ln for ln in self.supervisor.lanes.values() if ln.state in (LaneState.READY, LaneState.STARTING)
        ]

    def lanes_snapshot(self) -> list[dict[str, object]]:
        """Every lane's public state, as /api/lanes reports it."""
        return self.supervisor.snapshot()

    async def load(self, model_id: str) -> Lane:
        """Start `model_id`'s lane now (its residency rules decide what else stops)."""
        return await self.supervisor.load(model_id)

    async def unload(self, model_id: str) -> Lane:
        """Stop `model_id`'s lane (NotFound when it has never had one)."""
        return await self.supervisor.unload(model_id)

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
            speed=self.speeds.store.calibration(bandwidth=device_bandwidths(hardware)),
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
        library = self.catalog.servable()  # a draft model is chosen among them
        speeds = self.speeds.store.of(model_id)
        return await asyncio.to_thread(
            explain, entry, inputs=inputs, lane=snapshot, recorded=recorded, library=library, speeds=speeds
        )

    def explain_brief(self, model_id: str) -> Explanation | None:
        """For listings, from any thread: the decision and plan on the start-up snapshot (no bandwidth
        measured, nothing about the loaded lane); None before the hardware is probed."""
        hw = self.hardware
        if hw is None:
            return None
        entry = self.catalog.get(model_id, allow_broken=True)
        inputs = self._inputs(dataclasses.replace(hw, memory=read_memory()), exclude=model_id)
        return explain(entry, inputs=inputs, speeds=self.speeds.store.of(model_id))

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

    # ---- settings applied while running (docs/configuration.md#applied-without-a-restart) ------------
    async def apply_settings(self, new: Settings) -> SettingsChange:
        """Take `new` now: every part reads it from here on, each loaded lane whose start inputs changed
        restarts (alone), and keys a running server cannot take (host, port, TLS...) wait for its next
        start, named with why in the answer. A lane that cannot restart is reported, not raised."""
        async with self._applying:
            old = self.settings
            keys = changed_keys(old, new)
            stale = self._stale_lanes(old, new)
            await self._take(new, rescan=bool(set(keys) & RESCAN_KEYS))
            restarted: dict[str, str] = {}
            failed: dict[str, str] = {}
            for lane_id, why in stale.items():
                try:
                    await self.supervisor.restart(lane_id, reason=f"settings changed ({why})")
                    restarted[lane_id] = why
                except SwitchyardError as exc:
                    failed[lane_id] = exc.message
            return SettingsChange(
                applied=tuple(k for k in keys if k not in SERVER_KEYS),
                restarted=restarted,
                failed=failed,
                needs_server_restart={k: SERVER_KEYS[k] for k in keys if k in SERVER_KEYS},
                not_applied=_not_wired_changed(old, new),
            )

    async def change_settings(self, values: Mapping[str, Any]) -> SettingsChange:
        """Apply these top-level keys (as settings.json spells them) over the running settings; the rest
        stay as they are (command-line flags included). SettingsError names a bad key or value."""
        parsed = settings_from_mapping(dict(values), origin="the settings sent")
        merged = self.settings.replace(**{k: parsed.value(k) for k in values})
        return await self.apply_settings(merged)

    async def set_overrides(self, model_id: str, values: Mapping[str, Any]) -> SettingsChange:
        """Merge `values` (a load body: LOAD_KEYS) into the model's overrides and apply them: its lane,
        if loaded, restarts with them. BadRequestError names an unknown key or a bad value."""
        try:
            check_overrides(model_id, dict(values), allowed=LOAD_KEYS, where="the load body")
        except SettingsError as exc:
            raise BadRequestError(exc.message, param=next(iter(values), None)) from exc
        over = {k: dict(v) for k, v in self.settings.models.model_overrides.items()}
        over[model_id] = {**over.get(model_id, {}), **values}
        return await self.apply_settings(self.settings.replace(model_overrides=over))

    async def restore_overrides(self, model_id: str, entry: Mapping[str, Any] | None) -> SettingsChange:
        """Put one model's overrides back as they were (None: it had none), e.g. after a load body whose
        values the engine refused; a loaded lane restarts with them."""
        over = {k: dict(v) for k, v in self.settings.models.model_overrides.items() if k != model_id}
        if entry:
            over[model_id] = dict(entry)
        return await self.apply_settings(self.settings.replace(model_overrides=over))

    def _stale_lanes(self, old: Settings, new: Settings) -> dict[str, str]:
        """Loaded lanes whose start inputs differ, each with the keys that differ."""
        out: dict[str, str] = {}
        for lane in self.supervisor.lanes.values():
            if lane.state not in (LaneState.READY, LaneState.STARTING):
                continue
            keys = self.supervisor.setting_keys(lane.engine)  # what only its engine kind reads
            before = lane_inputs(old, model_id=lane.model_id, engine=lane.engine, engine_keys=keys)
            after = lane_inputs(new, model_id=lane.model_id, engine=lane.engine, engine_keys=keys)
            diff = [k for k in after if before.get(k) != after[k]]
            if diff:
                out[lane.id] = ", ".join(diff)
        return out

    async def _take(self, new: Settings, *, rescan: bool) -> None:
        # every holder of the settings, so nothing acts on a stale copy
        self.settings = new
        self.supervisor.settings = new
        for lane in self.supervisor.lanes.values():
            lane.settings = new
        for holder in (self.remotes, self.engines, self.tokens, self.hub):
            holder.settings = new
        await self.downloads.apply_settings(new)
        if rescan:
            self.catalog.dirs = tuple(new.library.models_dirs or (self.paths.models,))
            self.catalog.hf_cache = hub_config(new).cache_dir
            self.catalog.stores = app_stores(new)
            await asyncio.to_thread(self.catalog.scan)


def _not_wired_changed(old: Settings, new: Settings) -> tuple[str, ...]:
    models = set(old.models.model_overrides) | set(new.models.model_overrides)
    moved = [m for m in models if old.models.model_overrides.get(m) != new.models.model_overrides.get(m)]
    return tuple(sorted({k for m in moved for k in not_wired(new, model_id=m)}))


async def _enter(stack: contextlib.AsyncExitStack, part: AsyncPart) -> None:
    # its exit is pushed first, so a part that fails half-way through its own start (a session opened, a
    # file unreadable) is closed too; every part's __aexit__ copes with a start cut short
    stack.push_async_exit(part)
    await part.__aenter__()


def _log_notice(notice: str) -> None:
    log.warning("%s", notice)
