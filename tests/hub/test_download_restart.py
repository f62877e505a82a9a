"""A download resumed after a quick quit and restart (issue 33): the partial may still be locked by the
process being replaced while it shuts down; the resumed job waits for the lock instead of failing with
"being downloaded by another Switchyard process". The real download manager against the fake hub."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import hf_hub_download

from app.core.events import EventBus
from app.core.settings import Settings
from app.hub import cache_layout
from app.hub.download import DownloadManager, Job
from app.hub.transfer import TransferOptions
from tests.support.fakehub import FakeHub

MIB = 1 << 20
REPO = "org/restart-GGUF"
BIG = "restart-Q4_K_M.gguf"
FAST = TransferOptions(parts=4, min_part=MIB, chunk=64 * 1024, backoff_s=0.02, backoff_max_s=0.1)


def _blob(n: int) -> bytes:
    block = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(2048))  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


async def _until(cond: Callable[[], bool], within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _manager(tmp_path: Path) -> DownloadManager:
    return DownloadManager(settings=Settings(), bus=EventBus(), state_dir=tmp_path / "jobs", options=FAST)


def test_a_resumed_download_waits_for_the_lock_of_the_process_it_replaces(
    tmp_path: Path, fake_hub: FakeHub
) -> None:
    data = _blob(8 * MIB)
    fake_hub.add_repo(REPO, {BIG: data, "README.md": b"# restart\n"})
    fake_hub.faults.delay_per_chunk = 0.01

    async def first() -> str:
        async with _manager(tmp_path) as m:
            job = await m.submit(REPO, file=BIG)
            await _until(lambda: job.bytes_done >= 2 * MIB)
            return job.id  # the app quits mid-download

    async def second(job_id: str) -> Job:
        repo_dir = cache_layout.repo_folder(Path(os.environ["HF_HUB_CACHE"]), REPO)
        held = []
        for lock in repo_dir.rglob("lock"):  # the old process, still shutting down, holds its partials
            fd = os.open(lock, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            held.append(fd)
        assert held
        loop = asyncio.get_running_loop()
        loop.call_later(1.5, lambda: [os.close(fd) for fd in held])  # ...and then it is gone
        fake_hub.faults.delay_per_chunk = 0
        async with _manager(tmp_path) as m:
            return await m.wait(job_id)

    job_id = asyncio.run(first())
    job = asyncio.run(second(job_id))
    assert job.state == "completed", (job.error_code, job.error)
    local = hf_hub_download(REPO, BIG, cache_dir=os.environ["HF_HUB_CACHE"], local_files_only=True)
    assert Path(local).read_bytes() == data
