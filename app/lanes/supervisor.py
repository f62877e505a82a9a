"""The supervisor: lanes started just in time, swapped under a memory policy, unloaded when idle.

Policy: at most `max_loaded_lanes` generation lanes and `max_embedding_lanes` embedding lanes (embedding
models and rerankers together) are loaded; asking for another stops the least recently used idle one
first (waiting for its in-flight requests to finish, up to `drain_timeout_s`). With `residency:
"memory"` lanes also stay loaded together while their footprints fit (app/lanes/residency.py), and a
newcomer that lacks memory stops the least recently used idle ones first. In `single` mode too, small
side lanes (embeddings, rerankers, speech transcription and voices) load beside the text lane when their
footprint fits, and otherwise stop the least recently used idle lanes that hold the memory they lack,
each decision in the lane log. A lane idle for its TTL is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from app.core.background import SessionOwner, cancelled
from app.core.errors import (
    CapabilityMissingError,
    LaneBusyError,
    LaneNotFoundError,
    ModelTooLargeError,
    SwitchyardError,
)
from app.core.events import EventBus
from app.core.pins import PinStore
from app.core.platform.ports import free_loopback_port
from app.core.policy import parse_policy
from app.core.settings import Settings
from app.core.units import MIB
from app.hardware.model import Hardware
from app.hardware.probe import read_memory
from app.lanes.engines.kind import EngineKind, plan_window
from app.lanes.engines.once import start_scope
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.lanes.engines.registry import choose_kind, default_kind, engine_kinds, paired
from app.lanes.lane import Lane, LaneState, lane_slug
from app.lanes.proc import LogRing
from app.lanes.residency import (
    Footprint,
    Resident,
    describe,
    fmt_devices,
    free_bytes,
    gpu_free,
    gpu_used_now,
    plan_room,
    predicted_footprint,
    settle_rss,
)
from app.library.catalog import Catalog, ModelEntry
from app.routing.engines import title

log = logging.getLogger("switchyard.supervisor")
# side lanes: small models that load beside the text lane when their footprint fits, in both modes
_SIDE_KINDS = frozenset({"embedding", "rerank", "transcription", "speech"})
# embedding models and rerankers share one count limit (max_embedding_lanes); a count never evicts a chat lane
_SHARED_SIDE = frozenset({"embedding", "rerank"})


def _pool(kind: str) -> str:
    """The group of lane kinds whose count one limit caps."""
    return "side" if kind in _SHARED_SIDE else kind


def _rerank_note(entry: ModelEntry, capability: str) -> str | None:
    """What a reranker asked for something else, or another model asked to rerank, is told first."""
    if entry.kind == "rerank" and capability != "rerank":
        return f"model {entry.id!r} is a reranker, not a {capability} model; call POST /v1/rerank with it"
    if capability == "rerank" and entry.kind != "rerank":
        return (
            f"model {entry.id!r} is not a reranker (it is a {entry.kind} model); POST /v1/rerank needs a "
            "reranker GGUF (pooling type rank, e.g. a bge-reranker or Qwen3-Reranker build)"
        )
    return None


@dataclass
class _Prepared:
    """What one start asks before its plan, asked once and off the event loop: the catalog's entry (a
    rescan on a miss), its kind (the pin, the runtime choice) and what it drafts with; or the error that
    the start reports. `memo` keeps answers the plan asks again (engines/once.py)."""

    entry: ModelEntry | None = None
    kind: EngineKind | None = None
    error: SwitchyardError | None = None
    memo: dict[Hashable, object] = field(default_factory=dict)


class Supervisor(SessionOwner):
    def __init__(
        self,
        *,
        catalog: Catalog,
        settings: Settings,
        bus: EventBus,
        log_dir: Path,
        on_ready: Callable[[Lane], None] | None = None,
        pins: PinStore | None = None,
    ) -> None:
        self._on_ready = on_ready
        self.pins = pins
        self.catalog = catalog
        self.settings = settings
        self.bus = bus
        self.log_dir = log_dir
        self.lanes: dict[str, Lane] = {}
        self._swap_lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._dropping: set[str] = set()  # lanes whose model file was deleted, being stopped and dropped
        self.hardware: Hardware | None = None  # set by the Runtime once probed; None: no memory planning
        self.kinds: dict[str, EngineKind] = engine_kinds()
        # per model: the settle footprint of its last load (kept after it stops: the next load's need)
        self.settled: dict[str, Footprint] = {}
        # per model: a prediction made before a start where the plan carries none (side lanes' file sizes)
        self.predicted: dict[str, Footprint] = {}
        self._gpu_before: dict[str, dict[str, int]] = {}  # cards' memory used just before a start
        self._starts: dict[str, _Prepared] = {}  # per model: its start's answers, while it starts

    async def __aenter__(self) -> Supervisor:
        # no pool: a connection to a local engine lives as long as its request (on loopback a connect costs
        # less than a millisecond), so nothing is left open after a client goes away, and no request meets
        # a pooled socket the engine closed while idle (llama.cpp's 5 s keep-alive against aiohttp's 15 s)
        self.open_http(aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)))
        self._reaper = asyncio.create_task(self._reap_idle(), name="ttl-reaper")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancelled(self._reaper)
        await asyncio.gather(*(lane.close() for lane in self.lanes.values()), return_exceptions=True)
        await self.close_http()

    # ---- lanes ---------------------------------------------------------------------------------
    def kind_for(self, entry: ModelEntry) -> EngineKind:
        """The engine kind that starts `entry`: its pin, else the first for its format that can start here."""
        pinned = self.pins.get(entry.id) if self.pins else None
        return choose_kind(entry, self.settings, kinds=self.kinds, hardware=self.hardware, pinned=pinned)

    def capabilities(self, entry: ModelEntry) -> frozenset[str]:
        """What `entry` can be asked to do on the lane it runs on (pins and installs aside)."""
        lane = self.lanes.get(entry.id)
        kind = self.kinds.get(lane.engine) if lane is not None else None
        kind = kind or default_kind(entry, self.kinds)
        return kind.capabilities(entry, self.settings) if kind is not None else frozenset()

    def capability_error(self, entry: ModelEntry, capability: str) -> CapabilityMissingError | None:
        """None when `entry` can do `capability`; else a 400 naming the lanes and models that can."""
        if capability in self.capabilities(entry):
            return None
        lanes = [title(k.lane) for k in self.kinds.values() if capability in k.offers]
        # the last scan's entries, as they are: no stat nor rescan per model of a large library
        models = [e.id for e in self.catalog.servable() if capability in self.capabilities(e)]
        kind = default_kind(entry, self.kinds)
        where = f"runs on {title(kind.lane)}, which" if kind else "has no lane that"
        by = f"{', '.join(lanes)} lane(s)" if lanes else "no lane"
        have = f"; models that can: {', '.join(models[:20])}" if models else "; no model here can"
        lead = _rerank_note(entry, capability)
        if lead is not None:
            return CapabilityMissingError(f"{lead}{have}", param="model")
        return CapabilityMissingError(
            f"model {entry.id!r} {where} cannot do {capability}; {capability} is done by the {by}{have}",
            param="model",
        )

    def setting_keys(self, engine: str) -> tuple[str, ...]:
        """The Settings fields only the kind of lane id `engine` reads at a start (none for an unknown id)."""
        kind = self.kinds.get(engine)
        return kind.setting_keys if kind is not None else ()

    def _prepare(self, model_id: str) -> _Prepared:
        """A start's entry and kind (blocking: the supervisor runs it in a thread, once per start)."""
        prep = _Prepared()
        with start_scope(prep.memo):
            try:
                # re-read the catalog at each start: the file may have changed or vanished since
                fresh = self.catalog.get(model_id)
                kind = self.kind_for(fresh)
                prep.entry = paired(
                    kind, fresh, self.settings, self.catalog.servable(), hardware=self.hardware
                )
                prep.kind = kind
            except SwitchyardError as exc:  # the lane's start reports it (and fails)
                prep.error = exc
        return prep

    def _plan_factory(self, entry: ModelEntry) -> LaunchPlan:
        """The start's plan (the lane runs it in a thread): from the answers `ensure` prepared, else fresh."""
        prep = self._starts.get(entry.id) or self._prepare(entry.id)
        if prep.error is not None:
            raise prep.error
        assert prep.entry is not None and prep.kind is not None
        kind = prep.kind
        hw = self.hardware
        if hw is not None:
            # RAM is read fresh (it already reflects loaded engines); GPU figures come from the snapshot,
            # so subtract what the other loaded lanes were planned to take there
            hw = dataclasses.replace(hw, memory=read_memory())
        start = StartContext(
            ppid=os.getpid(), port=free_loopback_port(), hardware=hw, used=self.gpu_used(exclude=entry.id)
        )
        with start_scope(prep.memo):
            plan = kind.build(prep.entry, self.settings, start)
        lane = self.lanes.get(entry.id)
        if lane is not None:
            lane.engine = kind.lane
        return dataclasses.replace(plan, api=kind.api_style)  # what the lane asks of it follows its kind

    def gpu_used(self, *, exclude: str | None = None) -> dict[str, int]:
        used: dict[str, int] = {}
        for lane in list(self.lanes.values()):  # a copy: a start's plan reads this in a thread
            if lane.id == exclude or lane.state not in (LaneState.READY, LaneState.STARTING) or not lane.plan:
                continue
            pred = lane.plan.predicted()
            for d in pred["devices"] if pred else ():
                if d["device"] != "CPU":
                    used[d["device"]] = used.get(d["device"], 0) + int(d["total"])
        return used

    def lane_for(self, entry: ModelEntry) -> Lane:
        lane = self.lanes.get(entry.id)
        if lane is None:
            ring = LogRing(
                max_lines=self.settings.engines.log_ring_lines,
                file=self.log_dir / f"{lane_slug(entry.id)}.log",
            )
            default = default_kind(entry, self.kinds)
            lane = Lane(
                model_id=entry.id,
                kind=entry.kind,
                engine=default.lane if default else "none",
                plan_factory=lambda: self._plan_factory(entry),
                settings=self.settings,
                bus=self.bus,
                ring=ring,
                http=self.http,
                on_ready=self._lane_ready,
            )
            self.lanes[entry.id] = lane
        return lane

    def get_lane(self, lane_id: str) -> Lane:
        lane = self.lanes.get(lane_id)
        if lane is None:
            known = (
                ", ".join(self.lanes) or "none yet (a lane appears when its model is first used or loaded)"
            )
            raise LaneNotFoundError(f"no lane {lane_id!r}; lanes: {known}")
        return lane

    def judge_ids(self) -> frozenset[str]:
        """The library ids of the safety policy's judges (docs/safety.md): small side lanes of their own."""
        try:
            specs = parse_policy(self.settings.safety.policy).judges
        except SwitchyardError:
            return frozenset()
        ids = set()
        for spec in specs:
            with contextlib.suppress(SwitchyardError):
                if (entry := self.catalog.find(spec.model)) is not None:
                    ids.add(entry.id)
        return frozenset(ids)

    def pool_of(self, lane: Lane) -> str:
        """The group whose count one limit caps: judges have their own, beside the text lane."""
        return "judge" if lane.model_id in self.judge_ids() else _pool(lane.kind)

    def _loaded(self, pool: str) -> list[Lane]:
        return [
            ln
            for ln in self.lanes.values()
            if self.pool_of(ln) == pool and ln.state in (LaneState.READY, LaneState.STARTING)
        ]

    def _limit(self, pool: str) -> int | None:
        """How many lanes of `pool` may be loaded at once (None: no count cap, memory decides)."""
        if pool == "judge":
            return max(len(self.judge_ids()), 1)  # every judge of the policy may stay loaded
        if pool == "side":
            return self.settings.memory.max_embedding_lanes
        return self.settings.memory.loaded_lane_cap

    async def _make_room(self, target: Lane) -> None:
        """Memory first where residency is "memory" (it shares the machine by memory); then the count cap,
        if any, whose stops say that the count, not memory, made them."""
        pool = self.pool_of(target)
        by_memory = self.settings.memory.residency == "memory"
        if by_memory:
            await self._make_memory_room(target)
        cap = self._limit(pool)
        others = [ln for ln in self._loaded(pool) if ln is not target]
        excess = 0 if cap is None else len(others) + 1 - cap
        victims = sorted(others, key=lambda ln: (ln.in_flight > 0, ln.last_used or 0))[: max(0, excess)]
        for victim in victims:
            limit = f"only {cap} {target.kind} lane(s) may be loaded (max_loaded_lanes)"
            note = f"max_loaded_lanes is {cap}; memory would have held both" if by_memory else None
            await self._swap_out(victim, target, busy=f"{limit}; retry, or raise max_loaded_lanes", note=note)
        if not by_memory and (target.kind in _SIDE_KINDS or pool == "judge"):
            await self._make_memory_room(target, side=True)
        # the card's memory just before the start: the settle footprint is the delta from it
        self._gpu_before[target.model_id] = await asyncio.to_thread(gpu_used_now, self.hardware)

    async def _swap_out(self, victim: Lane, target: Lane, *, busy: str, note: str | None = None) -> None:
        """Stop `victim` for `target` once its requests are done (up to drain_timeout_s), else refuse."""
        async with victim.drained(wait_s=self.settings.engines.drain_timeout_s) as idle:
            if not idle:
                raise LaneBusyError(
                    f"cannot load {target.model_id!r}: {victim.model_id!r} is still serving "
                    f"{victim.in_flight} request(s) and {busy}"
                )
            if note is not None:
                line = f"--- switchyard: stopped {victim.model_id} to make room for {target.model_id}: {note}"
                log.info(line.removeprefix("--- switchyard: "))
                victim.ring.add(line)
                target.ring.add(line)
            await victim.stop(reason=f"swapped out for {target.model_id}")

    async def _make_memory_room(self, target: Lane, *, side: bool = False) -> None:
        """Residency "memory": stop the least recently used idle lanes until `target`'s footprint fits
        (busy ones only after they finish); refuse with the numbers when even that would not do.
        `side` (a side lane in single mode): the same rule, but where stopping every other lane would
        not make it fit, nothing is stopped and the start is tried anyway (the engine's start decides)."""
        need = await asyncio.to_thread(self.need_of, target)  # may read a GGUF's layout: off the loop
        for _ in range(len(self.lanes)):
            others = [ln for ln in self.lanes.values() if ln is not target and ln.state is LaneState.READY]
            free = self._free(others)
            room = plan_room(need, free=free, residents=[self._resident(ln) for ln in others])
            numbers = describe(need, free)
            if room.short and side:
                line = (
                    f"--- switchyard: loading {target.model_id} without stopping other lanes: it {numbers}, "
                    f"and stopping them all would still leave it {fmt_devices(room.short)} short"
                )
                log.warning(line.removeprefix("--- switchyard: "))
                target.ring.add(line)
                return
            if room.short:
                raise ModelTooLargeError(
                    f"cannot load {target.model_id!r}: it {numbers}, and stopping every other lane would "
                    f"still leave it {fmt_devices(room.short)} short; raise ram_budget_mib "
                    "or lower memory_reserve_mib, or choose a smaller quant or context"
                )
            if not room.victims:
                if others:
                    beside = ", ".join(ln.model_id for ln in others)
                    line = f"--- switchyard: loading {target.model_id} beside {beside}: {numbers}"
                    log.info(line.removeprefix("--- switchyard: "))
                    target.ring.add(line)
                return
            victim = self.lanes[room.victims[0].id]
            busy = f"{target.model_id!r} {numbers}; retry when it is done, or unload a model"
            await self._swap_out(victim, target, busy=busy, note=numbers)

    def _free(self, loaded: list[Lane]) -> dict[str, int]:
        return free_bytes(
            ram_available=read_memory().available,
            gpu_free=gpu_free(self.hardware),
            loaded=[self.footprint_of(ln) for ln in loaded],
            reserve=self.settings.memory.memory_reserve_mib * MIB,
            ram_budget=self.settings.memory.ram_budget_mib * MIB
            if self.settings.memory.ram_budget_mib
            else None,
        )

    def _resident(self, lane: Lane) -> Resident:
        return Resident(lane.id, lane.in_flight > 0, lane.last_used or 0.0, self.footprint_of(lane))

    def footprint_of(self, lane: Lane) -> Footprint | None:
        """What `lane` takes: its model's last settle footprint, else its prediction (MLX: none)."""
        measured = self.settled.get(lane.model_id)
        return measured if measured is not None else self.prediction_of(lane)

    def prediction_of(self, lane: Lane) -> Footprint | None:
        """`lane`'s predicted footprint: its plan's, else one made before its start (None for MLX)."""
        planned = predicted_footprint(lane.plan.predicted()) if lane.plan is not None else None
        return planned if planned is not None else self.predicted.get(lane.model_id)

    def need_of(self, lane: Lane) -> Footprint | None:
        """What starting `lane` will take: as `footprint_of`, else its kind's prediction (a llama.cpp memory
        plan, a speech model's files; None where only a measurement is real). Blocking: `ensure` runs it in
        a thread."""
        known = self.footprint_of(lane)
        if known is not None or self.hardware is None:
            return known
        prep = self._starts.get(lane.model_id) or self._prepare(lane.model_id)
        if prep.entry is None or prep.kind is None:
            return None  # the start itself says what is wrong with the model
        hw = dataclasses.replace(self.hardware, memory=read_memory())
        try:
            with start_scope(prep.memo):
                guess = prep.kind.predict(
                    prep.entry, self.settings, hardware=hw, used=self.gpu_used(exclude=lane.id)
                )
        except SwitchyardError:
            return None
        if guess is not None and prep.kind.memory != "planned":
            self.predicted[lane.model_id] = guess  # a planned kind's plan carries its own prediction
        return guess

    def _lane_ready(self, lane: Lane) -> None:
        if lane.proc is not None:  # first: a failing recorder below must not cost the measurement
            task = asyncio.create_task(self._settle(lane, lane.proc.pid), name=f"settle:{lane.model_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._on_ready is not None:
            self._on_ready(lane)

    async def _settle(self, lane: Lane, pid: int) -> None:
        """`lane`'s settle footprint: resident memory once it stops growing, plus each card's delta."""
        rss = await settle_rss(pid)
        if rss is None or lane.proc is None or lane.proc.pid != pid:
            return  # the engine went away meanwhile: nothing to measure
        devices = {"CPU": rss}
        before = self._gpu_before.pop(lane.model_id, {})
        after = await asyncio.to_thread(gpu_used_now, self.hardware) if before else {}
        devices.update({dev: max(0, after[dev] - used) for dev, used in before.items() if dev in after})
        self.settled[lane.model_id] = Footprint(devices, "measured")
        lane.ring.add(f"--- switchyard: settle footprint {fmt_devices(devices)} (used to plan residency)")

    async def ensure(self, model_id: str, *, entry: ModelEntry | None = None) -> Lane:
        """The lane for `model_id`, ready. Starts it (making room first) if needed. `entry`: the catalog's
        answer the caller already has (the gateway asks the catalog once per request)."""
        entry = entry if entry is not None and entry.id == model_id else self.catalog.get(model_id)
        lane = self.lane_for(entry)
        if lane.available:
            return lane
        async with self._swap_lock:
            if not lane.available:
                # the catalog, the pin and the kind choice (a runtime probe): once per start, off the loop
                self._starts[model_id] = await asyncio.to_thread(self._prepare, model_id)
                try:
                    await self._make_room(lane)
                    await lane.ensure_ready()
                finally:
                    self._starts.pop(model_id, None)
        return lane

    @contextlib.asynccontextmanager
    async def use(self, model_id: str, *, entry: ModelEntry | None = None) -> AsyncIterator[Lane]:
        """Hold a lane for one request: counts as in flight, refreshes last_used."""
        while True:
            lane = await self.ensure(model_id, entry=entry)
            if lane.available:  # nothing can intervene between this check and the count
                break
        with lane.request():
            yield lane

    async def load(self, model_id: str) -> Lane:
        return await self.ensure(model_id)

    async def restart(self, model_id: str, *, reason: str) -> Lane:
        """Stop a loaded lane once its requests end (up to drain_timeout_s: LaneBusyError, left serving)
        and start it again from the settings as they are now; a lane not loaded waits for its next use."""
        lane = self.get_lane(model_id)
        async with self._swap_lock:  # a start in progress finishes first; no other lane starts meanwhile
            if lane.state not in (LaneState.READY, LaneState.STARTING):
                return lane
            async with lane.drained(wait_s=self.settings.engines.drain_timeout_s) as idle:
                if not idle:
                    raise LaneBusyError(
                        f"cannot restart {model_id!r} for new settings: it is still serving "
                        f"{lane.in_flight} request(s); retry when they end (the settings are kept)"
                    )
                await lane.stop(reason=reason)
            await lane.ensure_ready()
        return lane

    async def unload(self, model_id: str) -> Lane:
        lane = self.get_lane(model_id)  # works even if the file has since vanished or broken
        await lane.stop(reason="unloaded on request")
        return lane

    async def forget(self, model_id: str) -> None:
        """Drop the lane of a model removed from the library (stopped: removal is refused while loaded),
        so `ps`, /api/lanes and the window stop listing a model that is gone."""
        lane = self.lanes.pop(model_id, None)
        if lane is not None:
            await lane.close()

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for lane in list(self.lanes.values()):
                if self._file_gone(lane):
                    self._dropping.add(lane.model_id)
                    task = asyncio.create_task(self._drop_gone(lane))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    continue
                ttl = self.ttl_of(lane)
                if (
                    lane.available
                    and lane.in_flight == 0
                    and ttl > 0
                    and lane.last_used is not None
                    and now - lane.last_used > ttl
                ):
                    task = asyncio.create_task(lane.stop(reason=f"idle for {ttl:g} s"))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def _file_gone(self, lane: Lane) -> bool:
        """Whether `lane`'s model file (or folder) was deleted behind our back: `rm` forgets its lane itself,
        a file removed by hand left it listed by `ps`, /api/ps and the Lanes page (issue 31)."""
        path = getattr(getattr(lane.plan, "params", None), "model_path", None)
        if not path or lane.in_flight or lane.model_id in self._dropping:
            return False
        return not os.path.exists(path)

    async def _drop_gone(self, lane: Lane) -> None:
        try:
            log.info(
                "the model file of %s was deleted: stopping its engine and dropping its lane", lane.model_id
            )
            await lane.stop(reason="its model file was deleted")
            if self.lanes.get(lane.model_id) is lane:
                await self.forget(lane.model_id)
        finally:
            self._dropping.discard(lane.model_id)

    def ttl_of(self, lane: Lane) -> float:
        """Idle seconds before `lane` is unloaded; 0 or less: never."""
        return lane.ttl_override if lane.ttl_override is not None else self.settings.ttl_for(lane.model_id)

    def set_ttl(self, model_id: str, seconds: float | None) -> None:
        """A per-lane idle TTL until the lane next stops (None: back to the settings; < 0: never unload)."""
        lane = self.lanes.get(model_id)
        if lane is not None:
            lane.ttl_override = seconds

    def snapshot(self) -> list[dict[str, object]]:
        return [{**lane.snapshot(), **self.residency_of(lane)} for lane in self.lanes.values()]

    def residency_of(self, lane: Lane) -> dict[str, object]:
        """What residency plans with, for ps, /api/lanes and the Lanes page: the footprint used (measured
        or predicted) and both figures beside it, how the engine's context memory is known, its window
        and KV estimate."""
        kind = self.kinds.get(lane.engine)
        capacity = lane.plan.memory if lane.plan is not None else (kind.memory if kind else None)
        fp, measured, predicted = (
            self.footprint_of(lane),
            self.settled.get(lane.model_id),
            self.prediction_of(lane),
        )
        row: dict[str, object] = {
            "footprint": fp.public() if fp else None,  # the one residency plans with
            "footprint_measured": measured.public() if measured else None,
            "footprint_predicted": predicted.public() if predicted else None,
            "capacity": capacity,
        }
        fit = lane.plan.fit if lane.plan is not None else None
        kv = sum(d.kv_cache for d in fit.chosen.devices) if fit is not None and fit.chosen else None
        ctx = (
            kind.window(lane.plan, lambda: self.catalog.find(lane.model_id))
            if kind
            else plan_window(lane.plan)
        )
        return {**row, "ctx": ctx, "kv_estimate": kv}
