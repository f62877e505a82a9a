"""Memory bandwidth (measured for real, cached as JSON) and the 1 Hz monitor on a real EventBus."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from app.core.events import Event, EventBus
from app.hardware.bandwidth import load_or_measure, machine_fingerprint, measure_bandwidth, read_cache
from app.hardware.model import Bandwidth
from app.hardware.monitor import SAMPLE_EVENT, Monitor
from tests.hardware.test_probe import H100_A, H100_B, RTX_4090, FakeNVML

SMALL = 16 << 20


def _small() -> Bandwidth:
    return measure_bandwidth(buffer_bytes=SMALL, repeats=2)


# --------------------------------------------------------------------------- bandwidth


def test_measure_bandwidth_default_is_fast_and_positive() -> None:
    t0 = time.perf_counter()
    bw = measure_bandwidth()
    # the copies stop at budget_s (1.5 s); the first touch of the buffers comes on top, and on a shared
    # two-core VM it alone has taken 2 s: a sanity bound, not a speed figure (those live in bench/)
    assert time.perf_counter() - t0 < 5.0
    assert bw.single_core > 100_000_000 and bw.all_cores > 100_000_000  # > 0.1 GB/s: any real RAM
    assert bw.threads >= 1 and abs(bw.measured_at - time.time()) < 10


def test_measure_bandwidth_threads() -> None:
    bw = measure_bandwidth(threads=3, buffer_bytes=SMALL, repeats=2)
    assert bw.threads == 3 and bw.all_cores > 0
    one = measure_bandwidth(threads=1, buffer_bytes=SMALL, repeats=2)
    assert one.threads == 1 and one.all_cores == one.single_core


def test_cache_written_then_reused(tmp_path: Path) -> None:
    cache = tmp_path / "home" / "hardware.json"
    calls: list[Bandwidth] = []

    def measure() -> Bandwidth:
        calls.append(_small())
        return calls[-1]

    first = load_or_measure(cache, measure=measure)
    assert len(calls) == 1 and first.single_core > 0
    doc = json.loads(cache.read_text())
    assert doc["bandwidth"]["all_cores"] == first.all_cores
    assert doc["bandwidth"]["fingerprint"] == machine_fingerprint()
    second = load_or_measure(cache, measure=measure)
    assert second == first and len(calls) == 1  # the file answered; nothing was measured again


def test_corrupt_cache_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "hardware.json"
    for junk in ("{not json", "[1, 2]", '{"bandwidth": {"version": 1, "single_core": "fast"}}', ""):
        cache.write_text(junk)
        bw = load_or_measure(cache, measure=_small)
        assert bw.single_core > 0
        assert read_cache(cache, fingerprint=machine_fingerprint()) == bw


def test_cache_from_another_machine_is_remeasured(tmp_path: Path) -> None:
    cache = tmp_path / "hardware.json"
    old = load_or_measure(cache, fingerprint="x86_64/128/128/512GiB", measure=_small)
    new = load_or_measure(cache, fingerprint="arm64/10/10/16GiB", measure=_small)
    assert new.measured_at > old.measured_at
    assert read_cache(cache, fingerprint="x86_64/128/128/512GiB") is None


def test_cache_keeps_other_keys(tmp_path: Path) -> None:
    cache = tmp_path / "hardware.json"
    cache.write_text(json.dumps({"probe": {"gpus": []}}))
    load_or_measure(cache, measure=_small)
    doc = json.loads(cache.read_text())
    assert doc["probe"] == {"gpus": []} and doc["bandwidth"]["single_core"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["hardware.json"]  # no temp file left behind


def test_unwritable_cache_still_returns_a_measurement(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    bw = load_or_measure(blocker / "hardware.json", measure=_small)  # parent is a file: cannot write
    assert bw.single_core > 0


# --------------------------------------------------------------------------- monitor


async def _collect(bus: EventBus, seconds: float) -> list[Event]:
    got: list[Event] = []
    async with bus.subscribe() as q:
        deadline = asyncio.get_running_loop().time() + seconds
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                got.append(await asyncio.wait_for(q.get(), left))
            except TimeoutError:
                break
    return [e for e in got if e.kind == SAMPLE_EVENT]


async def test_monitor_publishes_samples() -> None:
    bus = EventBus()
    async with bus.subscribe() as q:
        async with Monitor(bus, interval=0.2, sysfs_root=None) as mon:
            await asyncio.sleep(0.5)
        events = []
        while not q.empty():
            events.append(q.get_nowait())
    samples = [e for e in events if e.kind == SAMPLE_EVENT]
    assert len(samples) >= 2 and mon.published == len(samples)
    for e in samples:
        d = e.data
        assert d["ram_total"] > 0 and 0 < d["ram_available"] <= d["ram_total"]
        assert d["ram_used"] == d["ram_total"] - d["ram_available"]
        assert d["cpu_percent"] is None or 0.0 <= d["cpu_percent"] <= 100.0
        assert d["gpus"] == []  # no NVIDIA driver here, sysfs skipped
    json.dumps([e.data for e in samples])


async def test_monitor_stops_publishing_after_exit() -> None:
    bus = EventBus()
    async with Monitor(bus, interval=0.05, sysfs_root=None) as mon:
        await asyncio.sleep(0.12)
    n = mon.published
    assert n >= 1
    await asyncio.sleep(0.15)
    assert mon.published == n


async def test_monitor_reports_nvidia_cards() -> None:
    bus = EventBus()
    nv = FakeNVML([H100_A, H100_B])
    async with bus.subscribe() as q:
        async with Monitor(bus, interval=0.2, nvml=nv, sysfs_root=None):
            e = await asyncio.wait_for(q.get(), 2)
    assert [
        (g["vendor"], g["index"], g["memory_used"], g["utilization_percent"]) for g in e.data["gpus"]
    ] == [
        ("nvidia", 0, 531 << 20, 98),
        ("nvidia", 1, 70312 << 20, 41),
    ]
    assert (nv.inits, nv.shutdowns) == (1, 1)  # initialised once for the monitor's life, then released


async def test_monitor_skips_failing_samples_and_keeps_going() -> None:
    bus = EventBus()
    nv = FakeNVML([RTX_4090], fail_memory_calls={1, 2, 4})  # the 1st, 2nd and 4th samples fail
    async with bus.subscribe() as q:
        async with Monitor(bus, interval=0.05, nvml=nv, sysfs_root=None) as mon:
            while mon.published < 2:
                await asyncio.wait_for(q.get(), 2)
            assert mon.running
    assert mon.skipped >= 3 and mon.published >= 2 and not mon.running


async def test_monitor_without_nvml_library_still_samples() -> None:
    bus = EventBus()
    nv = FakeNVML([], init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    samples = []
    async with Monitor(bus, interval=0.1, nvml=nv, sysfs_root=None):
        samples = await _collect(bus, 0.25)
    assert samples and all(s.data["gpus"] == [] for s in samples)
    assert nv.shutdowns == 0
