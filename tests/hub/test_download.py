"""The download manager against the fake hub: quant pulls, cuts, 5xx, no Range, corruption, full disks,
pause/resume/cancel, restarts, update and rollback. Metadata goes through the real huggingface_hub."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import hf_hub_download, scan_cache_dir

from app.core.events import Event, EventBus
from app.core.settings import Settings
from app.hub import cache_layout
from app.hub.download import DownloadManager, Job
from app.hub.transfer import TransferOptions
from tests.support.fakehub import FakeHub

MIB = 1024 * 1024
REPO = "org/tiny-GGUF"
BIG = "tiny-Q4_K_M.gguf"
FAST = TransferOptions(parts=4, min_part=MIB, chunk=64 * 1024, backoff_s=0.02, backoff_max_s=0.1)


def blob(n: int, seed: int) -> bytes:
    """Deterministic incompressible bytes (fast: hash-expanded, not os.urandom per call)."""
    out = bytearray()
    block = hashlib.sha256(b"seed%d" % seed).digest() * 2048  # 64 KiB
    i = 0
    while len(out) < n:
        out += hashlib.sha256(block[:64] + i.to_bytes(4, "little")).digest() * 2048
        i += 1
    return bytes(out[:n])


@pytest.fixture
def repo(fake_hub: FakeHub) -> dict[str, bytes]:
    files = {
        BIG: blob(12 * MIB, 1),
        "Q8_0/tiny-Q8_0-00001-of-00003.gguf": blob(300_000, 2),
        "Q8_0/tiny-Q8_0-00002-of-00003.gguf": blob(300_000, 3),
        "Q8_0/tiny-Q8_0-00003-of-00003.gguf": blob(123_457, 4),
        "mmproj-tiny-F16.gguf": blob(70_000, 5),
        "README.md": b"---\nlicense: apache-2.0\n---\n# tiny\n",
    }
    fake_hub.add_repo(REPO, files)
    return files


def cache_dir() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def repo_dir() -> Path:
    return cache_layout.repo_folder(cache_dir(), REPO)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.asynccontextmanager
async def manager(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[DownloadManager, list[Event]]]:
    """A manager with its events recorded."""
    bus = EventBus()
    events: list[Event] = []
    kw.setdefault("options", FAST)
    async with bus.subscribe() as q:

        async def pump() -> None:
            while True:
                events.append(await q.get())

        task = asyncio.create_task(pump())
        try:
            async with DownloadManager(settings=Settings(), bus=bus, state_dir=tmp_path / "jobs", **kw) as m:
                yield m, events
        finally:
            await asyncio.sleep(0)
            task.cancel()


async def until(cond: Callable[[], bool], within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def gets(hub: FakeHub, path: str) -> list[str | None]:
    return [r for m, p, r in hub.requests if m == "GET" and p == path]


def range_starts(ranges: list[str | None]) -> list[int]:
    return [int(r[6:].split("-")[0]) for r in ranges if r]


def test_pull_multipart_quant_with_projector_lands_in_hf_cache(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    async def go() -> tuple[Job, list[Event]]:
        async with manager(tmp_path) as (m, events):
            job = await m.submit(REPO, quant="q8_0")
            await m.wait(job.id)
            await asyncio.sleep(0.05)
            return job, events

    job, events = asyncio.run(go())
    assert job.state == "completed", job.error
    want = [*sorted(p for p in repo if p.startswith("Q8_0/")), "mmproj-tiny-F16.gguf"]
    assert sorted(f.path for f in job.files) == sorted(want)
    kinds = [e.kind for e in events if e.data["id"] == job.id]
    assert (
        kinds[0] == "download.queued" and kinds[1] == "download.started" and kinds[-1] == "download.completed"
    )
    done = next(e for e in events if e.kind == "download.completed").data
    assert done["bytes_done"] == done["bytes_total"] == sum(len(repo[p]) for p in want)
    assert sum(e.data["delta"] for e in events if e.kind == "download.progress") == done["bytes_total"]
    # the HF cache layout, as huggingface_hub itself reads it
    commit = fake_hub.repos[REPO].head.sha
    assert cache_layout.read_ref(repo_dir(), "main") == commit
    (cached,) = scan_cache_dir(cache_dir()).repos
    assert cached.repo_id == REPO and {r.commit_hash for r in cached.revisions} == {commit}
    for p in want:
        local = hf_hub_download(REPO, p, cache_dir=cache_dir(), local_files_only=True)
        assert Path(local).is_symlink() and sha(Path(local).read_bytes()) == sha(repo[p])
        assert Path(local).resolve().name == sha(repo[p])  # blobs named by sha256
    assert not list((repo_dir() / "blobs").glob("*.incomplete.d"))


def test_large_file_ranged_parts_and_cut_connections_resume(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    fake_hub.faults.cut_after = 700_000
    fake_hub.faults.cut_times = 5

    async def go() -> Job:
        async with manager(tmp_path) as (m, _):
            job = await m.submit(REPO, quant="Q4_K_M")
            return await m.wait(job.id)

    job = asyncio.run(go())
    assert job.state == "completed", job.error
    size = len(repo[BIG])
    served = fake_hub.served[f"{REPO}/{BIG}"]
    assert size <= served < 1.3 * size
    starts = range_starts(gets(fake_hub, BIG))
    assert sorted(s for s in starts if s % (3 * MIB) == 0) == [0, 3 * MIB, 6 * MIB, 9 * MIB]  # four parts
    # every other request continued a part past its first byte, none refetched from a part's start
    assert len([s for s in starts if s % (3 * MIB)]) >= 4
    local = hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)
    assert sha(Path(local).read_bytes()) == sha(repo[BIG])

    # pulling it again fetches nothing: the blob is there
    fake_hub.reset_counters()
    assert asyncio.run(go()).state == "completed"
    assert not gets(fake_hub, BIG)


def test_5xx_is_retried_and_gated_is_not(tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]) -> None:
    fake_hub.faults.fail_5xx = 3
    fake_hub.add_repo("org/gated-GGUF", {"g-Q4_0.gguf": blob(5000, 9)}, gated="auto")

    async def go() -> tuple[Job, Job]:
        async with manager(tmp_path) as (m, _):
            a = await m.submit(REPO, file="README.md")
            b = await m.submit("org/gated-GGUF")
            return await m.wait(a.id), await m.wait(b.id)

    ok, gated = asyncio.run(go())
    assert ok.state == "completed", ok.error
    assert len(gets(fake_hub, "README.md")) == 4  # three 503s, then the answer
    assert gated.state == "failed" and gated.error_code == "hub_gated"
    assert "accept its license" in (gated.error or "")
    assert len(gets(fake_hub, "g-Q4_0.gguf")) == 1  # not retried
    assert not cache_layout.snapshot_files(cache_layout.repo_folder(cache_dir(), "org/gated-GGUF"), "x")


def test_server_without_range_restarts_from_zero_not_corrupt(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    fake_hub.faults.no_range = True

    async def go() -> Job:
        async with manager(tmp_path) as (m, _):
            return await m.wait((await m.submit(REPO, quant="Q4_K_M")).id)

    job = asyncio.run(go())
    assert job.state == "completed", job.error
    local = hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)
    assert sha(Path(local).read_bytes()) == sha(repo[BIG])
    assert gets(fake_hub, BIG)[-1] is None  # the last request asked for the whole file


def test_sha_mismatch_deletes_bytes_and_reports(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    fake_hub.faults.corrupt = {BIG}

    async def go() -> Job:
        async with manager(tmp_path) as (m, _):
            return await m.wait((await m.submit(REPO, quant="Q4_K_M")).id)

    job = asyncio.run(go())
    assert job.state == "failed" and job.error_code == "checksum_mismatch"
    got = sha(repo[BIG][: 6 * MIB] + bytes([repo[BIG][6 * MIB] ^ 0xFF]) + repo[BIG][6 * MIB + 1 :])
    assert (
        sha(repo[BIG]) in (job.error or "")
        and got in (job.error or "")
        and "retry the pull" in (job.error or "")
    )
    assert not (repo_dir() / "snapshots").exists()
    # no blob and no partial of the bad file (the projector that came with it verified, and stays for reuse)
    assert sorted(p.name for p in (repo_dir() / "blobs").iterdir()) == [sha(repo["mmproj-tiny-F16.gguf"])]
    assert cache_layout.read_ref(repo_dir(), "main") is None


def test_pause_resume_and_cancel(tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]) -> None:
    fake_hub.faults.delay_per_chunk = 0.02

    async def go() -> tuple[Job, Job, list[Event]]:
        async with manager(tmp_path) as (m, events):
            job = await m.submit(REPO, quant="Q4_K_M")
            await until(lambda: job.bytes_done > 2 * MIB)
            m.pause(job.id)
            assert job.state == "paused"
            paused_at = job.bytes_done
            partial = repo_dir() / "blobs" / f"{sha(repo[BIG])}.incomplete.d"
            assert (partial / "state.json").exists()
            n_before = len(gets(fake_hub, BIG))
            m.resume(job.id)
            await m.wait(job.id)
            resumed = gets(fake_hub, BIG)[n_before:]
            # continued, not restarted: the resume asks only for what the partial had not kept (it keeps
            # progress in steps, so a little past the last step is asked for again)
            asked = sum(int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in resumed if r))
            assert resumed and asked < len(repo[BIG]) and paused_at > 2 * MIB

            other = await m.submit(REPO, quant="Q8_0")
            await until(lambda: other.bytes_done > 0 or other.state != "queued")
            fake_hub.faults.delay_per_chunk = 0.05
            await m.cancel(other.id)
            return job, other, events

    job, other, events = asyncio.run(go())
    assert job.state == "completed", job.error
    kinds = [e.kind for e in events if e.data["id"] == job.id]
    assert "download.paused" in kinds and "download.resumed" in kinds and kinds[-1] == "download.completed"
    assert other.state == "cancelled"
    assert "download.cancelled" in [e.kind for e in events if e.data["id"] == other.id]
    assert not list((repo_dir() / "blobs").glob("*.incomplete.d"))
    assert not (tmp_path / "jobs" / f"{other.id}.json").exists()


def test_resume_straight_after_pause_waits_for_the_paused_transfer(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    """Pause then Resume with no pause between (two quick clicks): the new transfer waits until the old
    one has let go of the partial, instead of failing as "being downloaded by another process"."""
    fake_hub.faults.delay_per_chunk = 0.01

    async def go() -> tuple[Job, list[Event]]:
        async with manager(tmp_path) as (m, events):
            job = await m.submit(REPO, quant="Q4_K_M")
            for step in range(1, 5):
                await until(lambda n=step: job.bytes_done > n * MIB)  # type: ignore[misc]
                m.pause(job.id)
                m.resume(job.id)
            await m.wait(job.id)
            return job, events

    job, events = asyncio.run(go())
    assert job.state == "completed", job.error
    assert "download.failed" not in [e.kind for e in events if e.data["id"] == job.id]
    assert (repo_dir() / "blobs" / sha(repo[BIG])).read_bytes() == repo[BIG]


def test_restart_resumes_the_queued_job_from_its_partials(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    fake_hub.faults.delay_per_chunk = 0.01

    async def first() -> str:
        async with manager(tmp_path) as (m, _):
            job = await m.submit(REPO, quant="Q4_K_M")
            await until(lambda: job.bytes_done > 3 * MIB)
            return job.id  # the app stops here, mid-download

    async def second(job_id: str) -> tuple[Job, list[Event]]:
        async with manager(tmp_path) as (m, events):
            return await m.wait(job_id), events

    job_id = asyncio.run(first())
    saved = json.loads((tmp_path / "jobs" / f"{job_id}.json").read_text())
    assert saved["state"] in ("queued", "running")
    fake_hub.reset_counters()
    fake_hub.faults.delay_per_chunk = 0
    job, events = asyncio.run(second(job_id))
    assert job.state == "completed", job.error
    assert events[0].kind == "download.resumed"
    assert fake_hub.served[f"{REPO}/{BIG}"] < len(repo[BIG]) - 3 * MIB + 4 * 64 * 1024
    assert all(s > 0 for s in range_starts(gets(fake_hub, BIG)))
    assert sha(
        Path(hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)).read_bytes()
    ) == sha(repo[BIG])


def test_update_fetches_only_changes_then_rollback(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    new_big = blob(12 * MIB, 77)

    async def go() -> None:
        async with manager(tmp_path) as (m, _):
            for sel in ("Q4_K_M", "README.md"):
                assert (await m.wait((await m.submit(REPO, quant=sel)).id)).state == "completed"
            assert await m.update(REPO) is None  # nothing moved yet
            old = cache_layout.read_ref(repo_dir(), "main")
            new = fake_hub.commit(REPO, {BIG: new_big})
            fake_hub.reset_counters()
            job = await m.update(REPO)
            assert job is not None and job.previous == old and job.commit == new
            assert (await m.wait(job.id)).state == "completed", job.error
            assert cache_layout.read_ref(repo_dir(), "main") == new
            assert cache_layout.read_ref(repo_dir(), cache_layout.PREVIOUS_REF) == old
            assert not gets(fake_hub, "README.md")  # unchanged: linked from its blob, not fetched
            assert fake_hub.served[f"{REPO}/{BIG}"] == len(new_big)
            assert cache_layout.snapshot_files(repo_dir(), old) == cache_layout.snapshot_files(
                repo_dir(), new
            )
            back = m.rollback(REPO)
            assert back["commit"] == old and cache_layout.read_ref(repo_dir(), "main") == old
            # the commit left is kept apart: a second rollback is refused, never a move forward (issue 31)
            assert cache_layout.read_ref(repo_dir(), cache_layout.ROLLED_BACK_REF) == new
            assert cache_layout.read_ref(repo_dir(), cache_layout.PREVIOUS_REF) is None

    asyncio.run(go())
    local = hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)
    assert sha(Path(local).read_bytes()) == sha(repo[BIG])  # rolled back to the old bytes


def test_bad_selectors_and_unknown_repos_say_what_to_do(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    async def go() -> list[str]:
        msgs = []
        async with manager(tmp_path) as (m, _):
            for kw in ({"quant": "Q9_X"}, {}, {"file": "nope.gguf"}):
                with pytest.raises(Exception) as ei:
                    await m.submit(REPO, **kw)
                msgs.append(str(ei.value))
            with pytest.raises(Exception) as ei:
                await m.submit("org/does-not-exist")
            msgs.append(str(ei.value))
        return msgs

    q9, none, nofile, missing = asyncio.run(go())
    assert "Q4_K_M" in q9 and "Q8_0" in q9
    assert "name one" in none and f"{REPO}:" in none
    assert "nope.gguf" in nofile
    assert "not found" in missing


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Any:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip()}); disk-full untested")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_before_and_during_download(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tmpfs(tmp_path / "small", "4m") as small:
        monkeypatch.setenv("HF_HUB_CACHE", str(small / "hub"))

        async def before() -> Job:
            async with manager(tmp_path) as (m, _):
                return await m.wait((await m.submit(REPO, quant="Q4_K_M")).id)

        job = asyncio.run(before())
        assert job.state == "failed" and job.error_code == "disk_full"
        assert f"{12 * MIB + 70_000} bytes" in (job.error or "") and "free" in (job.error or "")

        fake_hub.faults.delay_per_chunk = 0.01
        half = blob(3 * MIB, 11)
        fake_hub.add_repo("org/half-GGUF", {"half-Q4_0.gguf": half})

        async def during() -> Job:
            async with manager(tmp_path, margin=lambda need: 0) as (m, _):
                job = await m.submit("org/half-GGUF")
                await until(lambda: job.bytes_done > 256 * 1024)
                free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
                (small / "filler").write_bytes(b"\0" * (free - 64 * 1024))  # someone else fills the disk
                await m.wait(job.id)
                assert job.state == "failed" and job.error_code == "disk_full", job.error
                assert "Free some space" in (job.error or "")
                hd = cache_layout.repo_folder(small / "hub", "org/half-GGUF")
                assert not (hd / "snapshots").exists() and not (hd / "blobs" / sha(half)).exists()
                (small / "filler").unlink()
                fake_hub.faults.delay_per_chunk = 0
                m.resume(job.id)
                return await m.wait(job.id)

        job = asyncio.run(during())
        assert job.state == "completed", job.error
        local = hf_hub_download(
            "org/half-GGUF", "half-Q4_0.gguf", cache_dir=small / "hub", local_files_only=True
        )
        assert sha(Path(local).read_bytes()) == sha(half)


def test_two_processes_never_write_the_same_partial(
    tmp_path: Path, fake_hub: FakeHub, repo: dict[str, bytes]
) -> None:
    fake_hub.faults.delay_per_chunk = 0.01

    async def go() -> tuple[Job, Job]:
        async with manager(tmp_path / "a") as (a, _), manager(tmp_path / "b") as (b, _):
            first = await a.submit(REPO, file=BIG)
            await until(lambda: first.bytes_done > 0)
            second = await b.submit(REPO, file=BIG)  # another process's manager, same cache
            await b.wait(second.id)
            fake_hub.faults.delay_per_chunk = 0
            return await a.wait(first.id), second

    first, second = asyncio.run(go())
    assert second.state == "failed" and second.error_code == "download_busy"
    assert "another Switchyard process" in (second.error or "")
    assert first.state == "completed", first.error
    local = hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)
    assert sha(Path(local).read_bytes()) == sha(repo[BIG])
