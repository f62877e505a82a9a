"""A 1 Hz hardware monitor: one task that publishes `hardware.sample` events on the EventBus.

Sampling runs in a worker thread (NVML and sysfs reads block). A sample that fails is skipped and the next
one is tried on schedule; nothing escapes the task, so a flaky driver never takes the app down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from app.core.background import cancelled
from app.core.events import EventBus, EventKind
from app.hardware.model import GPUSample
from app.hardware.nvidia import load_nvml, sample_nvidia
from app.hardware.swap import swap_now
from app.hardware.sysfs import SYSFS_ROOT, sample_sysfs_gpus

log = logging.getLogger(__name__)

SAMPLE_EVENT = EventKind.HARDWARE_SAMPLE


def _busy_idle(t: Any) -> tuple[float, float]:
    # iowait counts as idle: the CPU could have run something else meanwhile (psutil's rule too).
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest is inside user
    return total - idle, idle


class Monitor:
    """`async with Monitor(bus):` publishes a sample right away, then every `interval` seconds.

    Each event carries cpu_percent (all CPUs, since the previous sample), ram_total, ram_used (total minus
    available), ram_available, swap_used (None where the OS does not say) and gpus: a list of {index,
    vendor, memory_used, memory_total, utilization_percent} for NVIDIA (NVML) and AMD (sysfs) cards.
    `nvml` None uses the real pynvml; when NVML cannot start, NVIDIA cards are simply absent from samples.
    `sysfs_root` None skips sysfs."""

    def __init__(
        self,
        bus: EventBus,
        *,
        interval: float = 1.0,
        nvml: Any = None,
        sysfs_root: Path | None = SYSFS_ROOT,
    ) -> None:
        self._bus = bus
        self._interval = interval
        self._nvml_arg = nvml
        self._nvml: Any = None  # set only while NVML is initialised by us
        self._sysfs_root = sysfs_root
        self._task: asyncio.Task[None] | None = None
        self._last_cpu: tuple[float, float] | None = None
        self.published = 0
        self.skipped = 0

    @property
    def running(self) -> bool:
        """True while the sampling task is alive (it only ends when the monitor is exited)."""
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> Monitor:
        self._nvml = await asyncio.to_thread(self._start_nvml)
        self._last_cpu = _busy_idle(psutil.cpu_times())
        self._task = asyncio.create_task(self._run(), name="hardware-monitor")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await cancelled(self._task)
        self._task = None
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(nvml.nvmlShutdown)

    def _start_nvml(self) -> Any:
        nvml = self._nvml_arg if self._nvml_arg is not None else load_nvml()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception as e:  # no driver here: the monitor still reports CPU and RAM
            log.debug("hardware monitor without NVML: %s", e)
            return None
        return nvml

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            try:
                data = await asyncio.to_thread(self.sample)
                self._bus.publish(SAMPLE_EVENT, **data)
                self.published += 1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failing sample is skipped, never fatal
                self.skipped += 1
                log.debug("hardware sample skipped: %s: %s", type(e).__name__, e)
            # keep the cadence even when a sample is slow; after a long stall, restart it from now
            next_at = max(next_at + self._interval, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())

    def sample(self) -> dict[str, Any]:
        """One sample as the event's data (blocking; the monitor calls it in a thread)."""
        times = _busy_idle(psutil.cpu_times())
        last, self._last_cpu = self._last_cpu, times
        cpu_percent: float | None = None
        if last is not None:
            busy, idle = times[0] - last[0], times[1] - last[1]
            # None, not 0, when less than one clock tick passed: nothing was measured
            cpu_percent = round(100.0 * busy / (busy + idle), 1) if busy + idle > 0 else None
        vm, sw = psutil.virtual_memory(), swap_now()
        gpus: list[GPUSample] = []
        if self._nvml is not None:
            gpus += sample_nvidia(self._nvml)
        if self._sysfs_root is not None:
            gpus += sample_sysfs_gpus(self._sysfs_root)
        return {
            "cpu_percent": cpu_percent,
            "ram_total": int(vm.total),
            "ram_used": int(vm.total - vm.available),
            "ram_available": int(vm.available),
            "swap_used": sw.used if sw else None,
            "gpus": [g.public() for g in gpus],
        }
