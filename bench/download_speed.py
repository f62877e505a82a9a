"""`switchyard pull`'s engine against `huggingface_hub.hf_hub_download` on one large file from a local hub.

The fake hub (tests/support/fakehub.py) runs in a child process of its own, so the two clients measured here
never
share a GIL with the server. Two hubs serve the same generated file: one unlimited, one that paces each
connection to `--rate` bytes/s (what a CDN edge or a shaped link does to one TCP stream).

Each round fetches the file into a fresh cache folder with both clients, interleaved, the side that goes
first alternating. Ours is the DownloadManager, in-process, as `switchyard pull` drives it (model info,
then the ranged, verified transfer, then the snapshot link); theirs is `hf_hub_download` (HEAD, then GET).
Wall time and this process's CPU time (all threads) are taken per fetch; medians are printed with the
ratio theirs/ours (> 1: ours is faster).

    .venv/bin/python bench/download_speed.py                    # 200 MB, 40 MB/s cap, 3 rounds
    .venv/bin/python bench/download_speed.py --size-mb 100 --rate-mbps 20 --rounds 5
    .venv/bin/python bench/download_speed.py --tree /tmp/old    # the same against another tree's app/

Exits 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPO = "bench/big-GGUF"
FILE = "big-Q4_K_M.gguf"
MB = 1_000_000


def serve(size: int, rate: int | None) -> None:
    """Child process: a fake hub holding one `size`-byte file, until stdin closes."""
    sys.path.insert(0, str(ROOT))
    from tests.support.fakehub import FakeHub

    with FakeHub() as hub:
        hub.add_repo(REPO, {FILE: os.urandom(size)})
        _ = hub.file(REPO, FILE).sha256, hub.file(REPO, FILE).oid  # computed once, before any timing
        hub.faults.rate_bps = rate
        print(hub.url, flush=True)
        sys.stdin.read()


def start_hub(size: int, rate: int | None) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, __file__, "--serve", str(size), str(rate or 0)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def ours(url: str, cache: Path, *, parts: int) -> None:
    from app.core.events import EventBus
    from app.core.settings import Settings
    from app.hub.download import DownloadManager
    from app.hub.transfer import TransferOptions

    async def go() -> None:
        settings = Settings.flat(hf_endpoint=url, hf_cache_dir=str(cache))
        async with DownloadManager(
            settings=settings, bus=EventBus(), state_dir=cache / ".jobs", token=lambda: None,
            options=TransferOptions(parts=parts), resume_on_start=False,
        ) as m:  # fmt: skip
            job = await m.wait((await m.submit(REPO, file=FILE)).id)
            assert job.state == "completed", job.error

    asyncio.run(go())


def theirs(url: str, cache: Path) -> None:
    from huggingface_hub import hf_hub_download

    hf_hub_download(REPO, FILE, cache_dir=cache, endpoint=url)


def timed(fetch: Callable[[Path], None], work: Path) -> tuple[float, float]:
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    c0, t0 = cpu_s(), time.perf_counter()
    fetch(cache)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    shutil.rmtree(cache, ignore_errors=True)
    return wall, cpu


def scenario(name: str, url: str, rounds: int, parts: int, work: Path) -> dict[str, Any]:
    sides: dict[str, Callable[[Path], None]] = {
        "switchyard": lambda c: ours(url, c, parts=parts),
        "hf_hub_download": lambda c: theirs(url, c),
    }
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            got[side].append(timed(sides[side], work))
    out: dict[str, Any] = {"scenario": name}
    for side, runs in got.items():
        out[side] = {
            "wall_s": round(statistics.median(w for w, _ in runs), 3),
            "cpu_s": round(statistics.median(c for _, c in runs), 3),
            "runs_s": [round(w, 3) for w, _ in runs],
        }
    out["speedup"] = round(out["hf_hub_download"]["wall_s"] / out["switchyard"]["wall_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--rate-mbps", type=float, default=40.0, help="per-connection cap of the limited hub")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", type=int, default=4, help="our parallel parts (the download_parts default)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the tree whose app/ is measured")
    ap.add_argument("--serve", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1] or None)
        return
    sys.path.insert(0, str(args.tree.resolve()))
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_HUB_OFFLINE", None)
    size = args.size_mb * MB
    hubs = [("unlimited", *start_hub(size, None)), ("limited", *start_hub(size, int(args.rate_mbps * MB)))]
    try:
        with tempfile.TemporaryDirectory(prefix="dl-bench-") as tmp:
            timed(lambda c: ours(hubs[0][2], c, parts=args.parts), Path(tmp))  # warm-up: imports, page cache
            timed(lambda c: theirs(hubs[0][2], c), Path(tmp))
            for name, _, url in hubs:
                label = name if name == "unlimited" else f"{name} {args.rate_mbps:g} MB/s per connection"
                print(json.dumps(scenario(label, url, args.rounds, args.parts, Path(tmp))), flush=True)
    finally:
        for _, proc, _ in hubs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)


if __name__ == "__main__":
    main()
