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
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp

from app.core.errors import (
    CapabilityMissingError,
    LaneBusyError,
    LaneNotFoundError,
    ModelTooLargeError,
    SwitchyardError,
)
from app.core.events import EventBus
from app.core.pins import PinStore
from app.core.policy import parse_policy
from app.core.settings import Settings
from app.core.units import MIB
from app.fit.plan import FitReport
from app.hardware.model import Hardware
from app.hardware.probe import read_memory
from app.lanes.kind import EngineKind
from app.lanes.kinds import choose_kind, default_kind, engine_kinds
from app.lanes.lane import Lane, LaneState, lane_slug
from app.lanes.llamacpp import fit_for
from app.lanes.llamacpp_spec import with_draft
from app.lanes.mistralrs import with_assistant
from app.lanes.mlx import trained_context
from app.lanes.plan import LaunchPlan
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
from app.routing.engines import LLAMA_ENGINES, title

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Supervisor:
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
        self._http: aiohttp.ClientSession | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.hardware: Hardware | None = None  # set by the Runtime once probed; None: no memory planning
        self.kinds: dict[str, EngineKind] = engine_kinds()
        # per model: the settle footprint of its last load (kept after it stops: the next load's need)
        self.settled: dict[str, Footprint] = {}
        # per model: a prediction made before a start where the plan carries none (side lanes' file sizes)
        self.predicted: dict[str, Footprint] = {}
        self._gpu_before: dict[str, dict[str, int]] = {}  # cards' memory used just before a start

    async def __aenter__(self) -> Supervisor:
        self._http = aiohttp.ClientSession()
        self._reaper = asyncio.create_task(self._reap_idle(), name="ttl-reaper")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(lane.close() for lane in self.lanes.values()), return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "Supervisor used outside its context"
        return self._http

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

    def _plan_factory(self, entry: ModelEntry) -> LaunchPlan:
        # re-read the catalog at each start: the file may have changed or vanished since
        fresh = self.catalog.get(entry.id)
        kind = self.kind_for(fresh)
        if kind.lane in LLAMA_ENGINES:
            fresh = with_draft(fresh, self.settings, self.catalog.servable())
        elif kind.lane == "mistral.rs":  # its draft is an MTP assistant, paired by the same tokenizer check
            fresh = with_assistant(fresh, self.settings, self.catalog.servable(), hardware=self.hardware)
        hw = self.hardware
        if hw is not None:
            # RAM is read fresh (it already reflects loaded engines); GPU figures come from the snapshot,
            # so subtract what the other loaded lanes were planned to take there
            hw = dataclasses.replace(hw, memory=read_memory())
        plan = kind.build(
            fresh,
            self.settings,
            ppid=os.getpid(),
            free_port=free_port(),
            hardware=hw,
            used=self.gpu_used(exclude=entry.id),
        )
        lane = self.lanes.get(entry.id)
        if lane is not None:
            lane.engine = kind.lane
        return plan

    def gpu_used(self, *, exclude: str | None = None) -> dict[str, int]:
        used: dict[str, int] = {}
        for lane in self.lanes.values():
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
                max_lines=self.settings.log_ring_lines, file=self.log_dir / f"{lane_slug(entry.id)}.log"
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
            specs = parse_policy(self.settings.policy).judges
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

    def _limit(self, pool: str) -> int:
        if pool == "judge":
            return max(len(self.judge_ids()), 1)  # every judge of the policy may stay loaded
        return self.settings.max_embedding_lanes if pool == "side" else self.settings.max_loaded_lanes

    async def _make_room(self, target: Lane) -> None:
        pool = self.pool_of(target)
        others = [ln for ln in self._loaded(pool) if ln is not target]
        excess = len(others) + 1 - self._limit(pool)
        victims = sorted(others, key=lambda ln: (ln.in_flight > 0, ln.last_used or 0))[: max(0, excess)]
        for victim in victims:
            limit = f"only {self._limit(pool)} {target.kind} lane(s) may be loaded"
            await self._swap_out(victim, target, busy=f"{limit}; retry, or raise max_loaded_lanes")
        if self.settings.residency == "memory":
            await self._make_memory_room(target)
        elif target.kind in _SIDE_KINDS or pool == "judge":
            await self._make_memory_room(target, side=True)
        # the card's memory just before the start: the settle footprint is the delta from it
        self._gpu_before[target.model_id] = await asyncio.to_thread(gpu_used_now, self.hardware)

    async def _swap_out(self, victim: Lane, target: Lane, *, busy: str, note: str | None = None) -> None:
        """Stop `victim` for `target` once its requests are done (up to drain_timeout_s), else refuse."""
        async with victim.drained(wait_s=self.settings.drain_timeout_s) as idle:
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
        need = self.need_of(target)
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
            reserve=self.settings.memory_reserve_mib * MIB,
            ram_budget=self.settings.ram_budget_mib * MIB if self.settings.ram_budget_mib else None,
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
        """What starting `lane` will take: as `footprint_of`, else a fresh llama.cpp memory plan."""
        known = self.footprint_of(lane)
        if known is not None or self.hardware is None:
            return known
        try:
            entry = self.catalog.get(lane.model_id)
            engine = self.kind_for(entry).lane
            if engine not in LLAMA_ENGINES and lane.kind in _SIDE_KINDS and engine != "mlx":
                # a speech model (whisper.cpp, piper) maps its files whole: their size until one is measured
                size = sum(f.size for f in entry.files) or _size_of(entry.path)
                guess = Footprint({"CPU": size}, "predicted") if size else None
                if guess is not None:
                    self.predicted[lane.model_id] = guess
                return guess
            if engine not in LLAMA_ENGINES:
                return None  # runtime-managed kinds are known by their measured footprint only
            hw = dataclasses.replace(self.hardware, memory=read_memory())
            report = fit_for(entry, self.settings, hardware=hw, used=self.gpu_used(exclude=lane.id))
        except SwitchyardError:
            return None  # the start itself says what is wrong with the model
        if not isinstance(report, FitReport) or not report.placements:
            return None
        placement = report.chosen or report.placements[-1]  # no fit now: the CPU plan, the largest host need
        return Footprint({d.device: d.total for d in placement.devices}, "predicted")

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
                await self._make_room(lane)
                await lane.ensure_ready()
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
            async with lane.drained(wait_s=self.settings.drain_timeout_s) as idle:
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

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for lane in list(self.lanes.values()):
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
        if lane.engine == "mlx":
            # MLX grows its cache as requests come: the trained window is the bound, no KV estimate
            params = lane.plan.params if lane.plan is not None else None
            window = getattr(params, "trained_context", None) if params else self._mlx_window(lane)
            return {**row, "ctx": window or 0, "kv_estimate": None}
        fit = lane.plan.fit if lane.plan is not None else None
        ctx = getattr(lane.plan.params, "ctx_size", None) if lane.plan is not None else None
        kv = sum(d.kv_cache for d in fit.chosen.devices) if fit is not None and fit.chosen else None
        return {**row, "ctx": ctx, "kv_estimate": kv}

    def _mlx_window(self, lane: Lane) -> int | None:
        try:
            return trained_context(self.catalog.get(lane.model_id).path)
        except SwitchyardError:
            return None


def _size_of(path: Path) -> int:
    """Bytes of a model file, or of every file in a model folder; 0 when it cannot be read."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0
