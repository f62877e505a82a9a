"""Downloads at full speed: the checksum is taken in file order while the parts arrive, and every guarantee
of the transfer still holds (a bad byte anywhere is caught, a resumed partial is re-hashed from byte zero, a
server without Range cannot leave hashed bytes behind). Also the fake hub's per-connection rate limit."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import aiohttp
import pytest

from app.core.errors import ChecksumMismatchError, DownloadError
from app.hub import cache_layout
from app.hub.transfer import MIB, FileSpec, Transfer, TransferOptions, partial_bytes
from tests.hub.test_download import blob
from tests.support.fakehub import FakeHub, resolve_url

REPO = "org/speed-GGUF"
NAME = "speed-Q4_0.gguf"
SIZE = 4 * MIB
# four 1 MiB parts, hashed in 256 KiB steps: the hasher has to cross part boundaries many times
OPTS = TransferOptions(parts=4, min_part=MIB, chunk=64 * 1024, hash_block=256 * 1024, backoff_s=0.01,
                       backoff_max_s=0.02)  # fmt: skip


@pytest.fixture
def data(fake_hub: FakeHub) -> bytes:
    body = blob(SIZE, 42)
    fake_hub.add_repo(REPO, {NAME: body})
    return body


def spec(body: bytes) -> FileSpec:
    return FileSpec(NAME, len(body), sha256=hashlib.sha256(body).hexdigest())


def repo_dir(tmp_path: Path) -> Path:
    return cache_layout.repo_folder(tmp_path / "cache", REPO)


async def fetch(hub: FakeHub, body: bytes, where: Path, opts: TransferOptions = OPTS) -> Transfer:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        t = Transfer(session, resolve_url(hub, REPO, NAME), spec(body), where, headers={}, options=opts)
        await t.run()
        return t


@pytest.mark.parametrize("offset", [0, MIB - 1, MIB, 2 * MIB + 12345, 3 * MIB, SIZE - 1])
def test_a_bad_byte_in_any_part_is_caught(
    tmp_path: Path, fake_hub: FakeHub, data: bytes, offset: int
) -> None:
    fake_hub.faults.corrupt = {NAME}
    fake_hub.faults.corrupt_at = offset
    where = repo_dir(tmp_path)
    with pytest.raises(ChecksumMismatchError) as err:
        asyncio.run(fetch(fake_hub, data, where))
    bad = bytearray(data)
    bad[offset] ^= 0xFF
    assert hashlib.sha256(bad).hexdigest() in err.value.message  # the digest of exactly what arrived
    assert not cache_layout.blob_path(where, spec(data).key).exists()
    assert not cache_layout.partial_dir(where, spec(data).key).exists()


def test_the_hash_follows_the_bytes_while_they_arrive(tmp_path: Path, fake_hub: FakeHub, data: bytes) -> None:
    fake_hub.faults.rate_bps = 8 * MIB  # one connection: about half a second for the file
    seen: list[tuple[int, int]] = []  # (bytes written, bytes hashed) while the transfer runs

    async def go() -> Path:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            t = Transfer(session, resolve_url(fake_hub, REPO, NAME), spec(data), repo_dir(tmp_path),
                         headers={}, options=TransferOptions(parts=1, hash_block=256 * 1024))  # fmt: skip
            task = asyncio.create_task(t.run())
            while not task.done():
                seen.append((t.done, t.hashed))
                await asyncio.sleep(0.02)
            return await task

    landed = asyncio.run(go())
    assert hashlib.sha256(landed.read_bytes()).digest() == hashlib.sha256(data).digest()
    # halfway through the bytes, a good part of them is hashed already: not one pass after the transfer
    assert any(SIZE // 3 <= hashed <= done < SIZE for done, hashed in seen), seen[::5]


def _cut_run(hub: FakeHub, body: bytes, where: Path) -> None:
    """A first run that stops partway, its bytes kept as a partial (as after a kill or a lost network)."""
    hub.faults.cut_after = 600_000
    with pytest.raises(DownloadError):
        asyncio.run(fetch(hub, body, where, TransferOptions(parts=4, min_part=MIB, retries=0)))
    hub.faults.cut_after = None
    assert (cache_layout.partial_dir(where, spec(body).key) / "state.json").exists()


def test_resume_rehashes_the_prefix_and_fetches_only_the_rest(
    tmp_path: Path, fake_hub: FakeHub, data: bytes
) -> None:
    where = repo_dir(tmp_path)
    _cut_run(fake_hub, data, where)
    kept = partial_bytes(where, spec(data))
    fake_hub.reset_counters()
    landed = asyncio.run(fetch(fake_hub, data, where)).blob
    assert landed.read_bytes() == data
    assert kept > 0 and fake_hub.served[f"{REPO}/{NAME}"] == SIZE - kept  # the kept bytes were not refetched


def test_resume_still_catches_a_bad_byte_already_on_disk(
    tmp_path: Path, fake_hub: FakeHub, data: bytes
) -> None:
    where = repo_dir(tmp_path)
    _cut_run(fake_hub, data, where)
    partial = cache_layout.partial_dir(where, spec(data).key)
    # inside bytes the cut run kept (which parts got any depends on how far each got before the cut)
    parts = json.loads((partial / "state.json").read_text())["parts"]
    start, _end, done = max(parts, key=lambda p: p[2])
    assert done > 2
    at = start + done // 2
    with open(partial / "data", "r+b") as f:  # a bit flipped on disk between the runs
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ChecksumMismatchError):
        asyncio.run(fetch(fake_hub, data, where))
    assert not cache_layout.blob_path(where, spec(data).key).exists()


def test_a_server_without_range_rewrites_from_zero_and_the_hash_starts_over(
    tmp_path: Path, fake_hub: FakeHub, data: bytes
) -> None:
    where = repo_dir(tmp_path)
    _cut_run(fake_hub, data, where)
    partial = cache_layout.partial_dir(where, spec(data).key) / "data"
    with open(partial, "r+b") as f:  # bad kept bytes: hashed at the start, then overwritten by the refetch
        f.write(b"\0" * 1000)
    fake_hub.faults.no_range = True
    fake_hub.faults.rate_bps = 16 * MIB  # slow enough for the hasher to have read the bad prefix first
    landed = asyncio.run(fetch(fake_hub, data, where)).blob
    assert landed.read_bytes() == data


def test_the_fake_hub_limits_each_connection_not_the_total(
    tmp_path: Path, fake_hub: FakeHub, data: bytes
) -> None:
    rate = 6 * MIB
    fake_hub.faults.rate_bps = rate

    def timed(parts: int, folder: str) -> float:
        t0 = time.monotonic()
        asyncio.run(fetch(fake_hub, data, tmp_path / folder / "models--org--speed-GGUF",
                          TransferOptions(parts=parts, min_part=MIB)))  # fmt: skip
        return time.monotonic() - t0

    one = timed(1, "a")
    four = timed(4, "b")
    assert one >= 0.9 * SIZE / rate  # one stream cannot beat the cap
    assert four < 0.6 * one  # four streams each get the cap


def test_a_second_cancellation_does_not_cut_the_cleanup_short(
    tmp_path: Path, fake_hub: FakeHub, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled twice (a Pause, then the app quitting) while its background fsync still runs: the
    transfer lets go of the partial's lock and descriptors only after that thread, and always. Before, the
    second cancellation cut its cleanup short: the lock stayed held, and the next pull of the file failed
    as "being downloaded by another Switchyard process"."""
    import threading

    from app.hub import transfer as transfer_module

    fake_hub.faults.delay_per_chunk = 0.02
    syncing, gate = threading.Event(), threading.Event()
    original = transfer_module._datasync

    def slow_sync(fd: int) -> None:
        if not syncing.is_set():
            syncing.set()
            gate.wait(30)
        original(fd)

    monkeypatch.setattr(transfer_module, "_datasync", slow_sync)
    opts = TransferOptions(parts=1, chunk=64 * 1024, save_every_s=0.0)

    async def go() -> tuple[bool, int, int]:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            t = Transfer(session, resolve_url(fake_hub, REPO, NAME), spec(data), repo_dir(tmp_path),
                         headers={}, options=opts)  # fmt: skip
            task = asyncio.create_task(t.run())
            await asyncio.to_thread(syncing.wait, 30)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=0.3)
            gate.set()
            await asyncio.gather(task, return_exceptions=True)
            return bool(done), t._lock_fd, t._fd

    ended_early, lock_fd, fd = asyncio.run(go())
    assert not ended_early  # it waited for the fsync's thread
    assert (lock_fd, fd) == (-1, -1)
    fake_hub.faults.delay_per_chunk = 0
    asyncio.run(fetch(fake_hub, data, repo_dir(tmp_path), opts))  # the lock is free: the next pull runs
    assert cache_layout.blob_path(repo_dir(tmp_path), spec(data).key).read_bytes() == data
