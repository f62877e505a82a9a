"""Residency by memory: real llama.cpp lanes on tiny models, kept together while their measured settle
footprints fit a RAM budget, the least recently used idle one stopped when a newcomer does not fit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.errors import LaneBusyError, ModelTooLargeError, SettingsError
from app.core.paths import Paths
from app.core.settings import Settings, settings_from_mapping
from app.core.units import MIB
from app.lanes.lane import LaneState
from app.lanes.residency import Footprint, Resident, free_bytes, plan_room
from app.runtime import Runtime
from tests.conftest import link_models
from tests.support.tinymodels import TinySpec, write_tiny_gguf

A, B, C = "tiny", "tiny2", "tiny3"


@pytest.fixture(scope="module")
def three_models(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    d = link_models(
        tmp_path_factory.mktemp("residency"), model_store / "tiny.gguf", model_store / "tiny2.gguf"
    )
    write_tiny_gguf(d / "tiny3.gguf", TinySpec(seed=9))
    return d


@pytest.fixture
async def rt(three_models: Path) -> AsyncIterator[Runtime]:
    s = Settings.flat(
        models_dirs=(three_models,), residency="memory", max_loaded_lanes=3, memory_reserve_mib=0
    )
    async with Runtime(settings=s, paths=Paths.from_env()) as runtime:
        yield runtime


async def settled(rt: Runtime, *ids: str, within: float = 15) -> dict[str, int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(i in rt.supervisor.settled for i in ids):
            return {i: rt.supervisor.settled[i].devices["CPU"] for i in ids}
        await asyncio.sleep(0.05)
    raise AssertionError(f"no settle footprint for {ids}: {list(rt.supervisor.settled)}")


def ready(rt: Runtime) -> set[str]:
    return {lane.model_id for lane in rt.supervisor.lanes.values() if lane.state is LaneState.READY}


def budget(rt: Runtime, mib: int, **more: object) -> None:
    rt.supervisor.settings = rt.supervisor.settings.replace(ram_budget_mib=mib, **more)  # type: ignore[arg-type]


async def test_memory_residency_keeps_two_and_evicts_the_least_recently_used(rt: Runtime) -> None:
    sup = rt.supervisor
    for mid in (A, B, C):  # a large budget: all three stay loaded together, each one measured
        await sup.load(mid)
    assert ready(rt) == {A, B, C}
    fp = await settled(rt, A, B, C)
    rows = {r["model"]: r for r in sup.snapshot()}
    assert rows[A]["footprint"] == {"source": "measured", "total": fp[A], "devices": {"CPU": fp[A]}}
    assert rows[A]["capacity"] == "planned" and isinstance(rows[A]["kv_estimate"], int)
    assert isinstance(rows[A]["ctx"], int) and rows[A]["ctx"] > 0

    await sup.unload(C)
    # room for A and B and half of C: loading C must stop one of them
    budget(rt, (fp[A] + fp[B] + fp[C] // 2) // MIB)
    async with sup.use(B):  # B is used after A: A is the least recently used
        pass
    await sup.load(C)
    assert ready(rt) == {B, C}
    line = next(x for x in sup.lanes[C].ring.tail(5000) if "to make room" in x)
    assert f"stopped {A} to make room for {C}: needs " in line and " free" in line
    assert any("to make room" in x for x in sup.lanes[A].ring.tail(5000))

    # both loaded lanes busy: the newcomer waits for the drain deadline, then is refused with the numbers
    budget(rt, (fp[B] + fp[C] + fp[A] // 2) // MIB, drain_timeout_s=0.3)
    async with sup.use(B), sup.use(C):
        with pytest.raises(LaneBusyError, match=r"needs .* free; retry when it is done"):
            await sup.load(A)
    assert ready(rt) == {B, C}

    # a budget no eviction can satisfy: refused at once, nothing stopped
    budget(rt, fp[A] // MIB // 2)
    with pytest.raises(ModelTooLargeError, match=r"needs .*short; raise ram_budget_mib"):
        await sup.load(A)
    assert ready(rt) == {B, C}


def test_room_policy_prefers_idle_and_least_recently_used() -> None:
    fp = Footprint({"CPU": 100 * MIB}, "measured")
    residents = [
        Resident("old-busy", True, 1.0, fp),
        Resident("new-idle", False, 3.0, fp),
        Resident("old-idle", False, 2.0, fp),
        Resident("gpu-only", False, 0.5, Footprint({"GPU0": 100 * MIB}, "measured")),
    ]
    free = free_bytes(ram_available=None, gpu_free={}, loaded=[fp, fp, fp], reserve=0, ram_budget=350 * MIB)
    assert free == {"CPU": 50 * MIB}
    room = plan_room(Footprint({"CPU": 200 * MIB}, "predicted"), free=free, residents=residents)
    assert [r.id for r in room.victims] == ["old-idle", "new-idle"] and room.short == {}
    assert plan_room(None, free=free, residents=residents).victims == ()


def test_residency_settings_are_checked() -> None:
    s = settings_from_mapping({"residency": "memory", "ram_budget_mib": 2048, "memory_reserve_mib": 0})
    assert (s.memory.residency, s.memory.ram_budget_mib, s.memory.memory_reserve_mib) == ("memory", 2048, 0)
    assert Settings().memory.residency == "single" and Settings().memory.ram_budget_mib is None
    for bad in ({"residency": "shared"}, {"ram_budget_mib": "2G"}, {"memory_reserve_mib": -1}):
        with pytest.raises(SettingsError):
            settings_from_mapping(bad)
