"""A Pause that lands while a transfer's work is in a thread (opening the partial and taking its lock, or
landing the verified bytes): the transfer waits for that thread before it lets go, so nothing it opened
outlives it and nothing it closed is still in use. Seen as "being downloaded by another Switchyard process"
after Download, Pause at once, Resume (tests/ui/test_keyboard_tables.py under load)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from app.core.events import Event
from app.hub import cache_layout
from app.hub.download import DownloadManager
from app.hub.transfer import Transfer, TransferOptions
from tests.hub.test_download import manager as recorded_manager
from tests.support.asyncwait import until
from tests.support.fakehub import FakeHub

REPO = "org/pause-GGUF"
FILE = "pause-Q4_0.gguf"
DATA = bytes(range(256)) * 1024  # 256 KiB, one part
OPTS = TransferOptions(chunk=64 * 1024, backoff_s=0.02, backoff_max_s=0.1)


class Gate:
    """Holds the first call of a Transfer method in its thread until `release()`; records how it ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.entered, self.left, self.gate = threading.Event(), threading.Event(), threading.Event()
        self.outcome: list[BaseException | None] = []
        original = getattr(Transfer, name)
        first = threading.Lock()

        def held(transfer: Transfer, *args: Any) -> Any:
            if not first.acquire(blocking=False):
                return original(transfer, *args)  # later calls (the resumed run) go straight through
            self.entered.set()
            self.gate.wait(30)
            try:
                result = original(transfer, *args)
            except BaseException as exc:
                self.outcome.append(exc)
                raise
            else:
                self.outcome.append(None)
                return result
            finally:
                self.left.set()

        monkeypatch.setattr(Transfer, name, held)

    def release(self) -> None:
        self.gate.set()


def manager(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[tuple[DownloadManager, list[Event]]]:
    """test_download's manager (its events recorded), with this file's small chunks."""
    return recorded_manager(tmp_path, options=OPTS)


def landed() -> bytes:
    repo_dir = cache_layout.repo_folder(Path(os.environ["HF_HUB_CACHE"]), REPO)
    return (repo_dir / "blobs" / hashlib.sha256(DATA).hexdigest()).read_bytes()


def test_resume_after_a_pause_while_the_partial_was_being_opened(
    tmp_path: Path, isolated_env: Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the cancelled open's thread took the partial's lock after its transfer had ended;
    nothing released it, and the resumed job failed as "being downloaded by another Switchyard process"."""
    fake_hub.add_repo(REPO, {FILE: DATA}, tags=["gguf"])
    opening = Gate(monkeypatch, "_open")

    async def go() -> tuple[str, str | None, list[str]]:
        async with manager(tmp_path) as (m, events):
            job = await m.submit(REPO, file=FILE)
            await until(opening.entered.is_set, what="the partial being opened")
            m.pause(job.id)
            opening.release()
            await asyncio.to_thread(opening.left.wait, 30)  # the open's thread has taken the lock
            m.resume(job.id)
            await m.wait(job.id)
            return job.state, job.error, [e.kind for e in events if e.data["id"] == job.id]

    state, error, kinds = asyncio.run(go())
    assert opening.outcome == [None]  # the held open itself succeeded: the lock was taken, then let go
    assert state == "completed", error
    assert "download.paused" in kinds and "download.failed" not in kinds, kinds
    assert landed() == DATA


def test_pause_while_the_bytes_land_waits_for_the_landing(
    tmp_path: Path, isolated_env: Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the paused transfer closed its descriptors while its landing thread was still to
    fsync them (EBADF, or another file's descriptor by the same number)."""
    fake_hub.add_repo(REPO, {FILE: DATA}, tags=["gguf"])
    finishing = Gate(monkeypatch, "_finish")

    async def go() -> tuple[bool, str, str | None]:
        async with manager(tmp_path) as (m, _events):
            job = await m.submit(REPO, file=FILE)
            await until(finishing.entered.is_set, what="the bytes landing")
            run = next(t for t in asyncio.all_tasks() if t.get_name() == f"download-{job.id}")
            m.pause(job.id)
            # the paused run may not end while its landing thread is held (before the fix it ended at
            # once, closing what the thread was about to use)
            done, _ = await asyncio.wait({run}, timeout=1.0)
            finishing.release()
            await asyncio.gather(run, return_exceptions=True)
            m.resume(job.id)
            await m.wait(job.id)
            return bool(done), job.state, job.error

    ended_early, state, error = asyncio.run(go())
    assert finishing.outcome == [None], finishing.outcome
    assert not ended_early
    assert state == "completed", error
    assert landed() == DATA


def test_two_quick_pause_resume_pairs_wait_for_the_first_transfer(
    tmp_path: Path, isolated_env: Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pause, Resume, Pause, Resume while the first transfer still holds the partial's lock: the second
    run, paused while it waited for the first, used to end at once; the third waited only for it and
    failed as "being downloaded by another Switchyard process" while the first still held the lock."""
    fake_hub.add_repo(REPO, {FILE: DATA}, tags=["gguf"])
    original = Transfer._open
    locked, gate, calls = threading.Event(), threading.Event(), []

    def open_then_hold(transfer: Transfer) -> None:
        original(transfer)  # the lock is taken
        calls.append(transfer)
        if len(calls) == 1:  # the first run's thread keeps it a while
            locked.set()
            gate.wait(30)

    monkeypatch.setattr(Transfer, "_open", open_then_hold)

    async def go() -> tuple[str, str | None, list[str]]:
        async with manager(tmp_path) as (m, events):
            job = await m.submit(REPO, file=FILE)
            await asyncio.to_thread(locked.wait, 30)
            for _ in range(2):  # two quick clicks on each
                m.pause(job.id)
                await asyncio.sleep(0.05)
                m.resume(job.id)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # long enough for a third run that did not wait to fail
            gate.set()
            await m.wait(job.id)
            return job.state, job.error, [e.kind for e in events if e.data["id"] == job.id]

    state, error, kinds = asyncio.run(go())
    assert state == "completed", error
    assert "download.failed" not in kinds, kinds
    assert landed() == DATA
