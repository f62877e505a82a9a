"""Memory bandwidth, measured once per machine with numpy and cached as JSON.

Token generation on CPU (and on unified memory) is bound by how fast weights stream from RAM, so the fit
layer turns this figure into tokens/s. A large array copy is timed a few times, best of: one thread, then
all usable cores at once (numpy's copy releases the GIL, so threads really run in parallel).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from app.hardware.cpu import usable_cores
from app.hardware.model import Bandwidth

log = logging.getLogger(__name__)

CACHE_KEY = "bandwidth"
_VERSION = 1
# Big enough to spill the last-level cache of common desktops and servers (16 MiB per thread, at least
# 128 MiB), small enough that first-touching it stays well under a second on a slow VM.
_MIN_BUFFER = 128 << 20
_MAX_BUFFER = 512 << 20
_PER_THREAD = 16 << 20


def machine_fingerprint() -> str:
    """What would make an old measurement wrong: another CPU count, cgroup, arch or RAM size.

    RAM is rounded to GiB because the kernel's reserved memory (and so MemTotal) moves a little between
    kernel versions on the same machine."""
    ram_gib = int(psutil.virtual_memory().total) >> 30
    return f"{platform.machine()}/{os.cpu_count()}/{usable_cores()}/{ram_gib}GiB"


def _buffer_size(threads: int, requested: int | None) -> int:
    want = requested or min(_MAX_BUFFER, max(_MIN_BUFFER, threads * _PER_THREAD))
    # two arrays of this size must leave most of the free memory alone
    cap = int(psutil.virtual_memory().available) // 8
    return max(1 << 20, min(want, cap))


def measure_bandwidth(
    *, threads: int | None = None, buffer_bytes: int | None = None, repeats: int = 5, budget_s: float = 1.5
) -> Bandwidth:
    """Time `repeats` copies per mode (best of), stopping a mode early when its half of `budget_s` is spent;
    each mode runs at least once."""
    n = threads or usable_cores()
    size = _buffer_size(n, buffer_bytes)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bandwidth") as pool:
        src, dst = np.empty(size, dtype=np.uint8), np.empty(size, dtype=np.uint8)
        srcs, dsts = np.array_split(src, n), np.array_split(dst, n)
        # First touch in parallel: page faults would otherwise be timed, and are slow single-threaded.
        list(pool.map(lambda k: _touch(srcs[k], dsts[k]), range(n)))
        single = _best(lambda: _copy_once(src, dst), repeats, start + budget_s / 2)
        if n == 1:
            multi = single
        else:
            barrier = threading.Barrier(n)
            multi = _best(lambda: _copy_parallel(pool, srcs, dsts, barrier), repeats, start + budget_s)
    return Bandwidth(single_core=single, all_cores=multi, threads=n, measured_at=time.time())


def _touch(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> None:
    src.fill(1)
    dst.fill(0)


def _best(run: Callable[[], int], repeats: int, deadline: float) -> int:
    best = run()
    for _ in range(repeats - 1):
        if time.perf_counter() >= deadline:
            break
        best = max(best, run())
    return best


def _copy_once(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> int:
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return int(2 * src.nbytes / max(time.perf_counter() - t0, 1e-9))  # read + write


def _copy_parallel(
    pool: ThreadPoolExecutor,
    srcs: list[np.ndarray[Any, Any]],
    dsts: list[np.ndarray[Any, Any]],
    barrier: threading.Barrier,
) -> int:
    def work(k: int) -> tuple[float, float]:
        barrier.wait(timeout=30)  # all slices start together; one slow starter would hide the peak
        t0 = time.perf_counter()
        np.copyto(dsts[k], srcs[k])
        return t0, time.perf_counter()

    spans = list(pool.map(work, range(len(srcs))))
    elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
    return int(2 * sum(s.nbytes for s in srcs) / max(elapsed, 1e-9))


def read_cache(path: Path, *, fingerprint: str) -> Bandwidth | None:
    """The cached measurement, or None when the file is missing, corrupt, old or from another machine."""
    try:
        entry = json.loads(path.read_text())[CACHE_KEY]
        if entry["version"] != _VERSION or entry["fingerprint"] != fingerprint:
            return None
        single, multi, threads = entry["single_core"], entry["all_cores"], entry["threads"]
        at = entry["measured_at"]
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (single, multi, threads)
        ):
            return None
        if not isinstance(at, int | float):
            return None
        return Bandwidth(single_core=single, all_cores=multi, threads=threads, measured_at=float(at))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_cache(path: Path, bw: Bandwidth, *, fingerprint: str) -> None:
    """Store `bw` under the "bandwidth" key, keeping other keys of a valid file; atomic replace, so a
    crash mid-write leaves the old file, never half a new one."""
    try:
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        doc = {}
    doc[CACHE_KEY] = {"version": _VERSION, "fingerprint": fingerprint, **bw.public()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_or_measure(
    path: Path,
    *,
    fingerprint: str | None = None,
    measure: Callable[[], Bandwidth] = measure_bandwidth,
) -> Bandwidth:
    """The cached figure for this machine, else a fresh measurement written back to `path`. A cache that
    cannot be written is logged, not raised: the measurement is still good for this run."""
    fp = fingerprint if fingerprint is not None else machine_fingerprint()
    cached = read_cache(path, fingerprint=fp)
    if cached is not None:
        return cached
    bw = measure()
    try:
        write_cache(path, bw, fingerprint=fp)
    except OSError as e:
        log.warning("could not cache memory bandwidth in %s: %s", path, e)
    return bw
