"""One file's transfer: ranged parts in parallel, resumable across cuts and restarts, verified before use.

The partial lives beside the blob it becomes, in `blobs/<key>.incomplete.d/`:

    data        the file, sparse, each part written at its own offset
    state.json  the parts as [start, end, done]; `done` is only ever raised after its bytes were written,
                so after a kill the next run rewrites at most a little, never trusts unwritten bytes
    lock        flock'ed by the process writing, so a server and a `pull` never write the same partial

A cut connection, a timeout, a 5xx or a 429 is retried with exponential backoff and jitter, each part
continuing from its last written byte. A 200 answer to a Range request (a server or mirror that ignores
Range) is detected: the file is then fetched as one stream from byte zero instead of being corrupted.
The data is hashed (sha256 for LFS files, the git blob sha1 otherwise) while it arrives, in file order: a
background task reads back each stretch of the file once every byte before it is written, so when the last
part lands only its tail is left to hash. A resumed partial is re-hashed from byte zero the same way, while
the rest arrives: nothing is trusted for having been on disk. Only a match is renamed to `blobs/<key>`; a
mismatch deletes the bytes and raises ChecksumMismatchError.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from app.core import background
from app.core.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadBusyError,
    DownloadError,
    HubAuthError,
    HubFileNotFoundError,
    HubGatedError,
    SwitchyardError,
)
from app.core.platform import locks
from app.hub import cache_layout

MIB = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class FileSpec:
    """One repository file as the hub describes it at one commit."""

    path: str
    size: int
    sha256: str | None = None  # LFS files
    oid: str | None = None  # the git blob id (what a non-LFS blob is named after)

    @property
    def key(self) -> str:
        """The blob's name in the cache: the sha256 for LFS files, the git oid otherwise."""
        key = self.sha256 or self.oid
        if not key:
            raise DownloadError(
                f"the hub gave no checksum for {self.path}; it cannot be verified, so it is not fetched"
            )
        return key

    def public(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "oid": self.oid}


@dataclass(frozen=True)
class TransferOptions:
    parts: int = 4
    min_part: int = 4 * MIB  # smaller files go in one part: a Range request each is not worth it
    chunk: int = 256 * 1024
    retries: int = 6  # tries in a row without progress before the file fails
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    read_timeout_s: float = 60.0
    save_every_s: float = 0.5  # how often state.json is rewritten while bytes arrive
    hash_block: int = 4 * MIB  # the in-order hasher reads back this much at a time (the tail left at the end)


class _Retryable(Exception):
    pass


class _NoRange(Exception):
    """The server answered a Range request with the whole file."""


def _write_at(fd: int, data: bytes, pos: int) -> None:
    if hasattr(os, "pwrite"):
        os.pwrite(fd, data, pos)
    else:  # Windows: seek and write with no await between them, so no other part moves the offset
        os.lseek(fd, pos, os.SEEK_SET)
        os.write(fd, data)


def _datasync(fd: int) -> None:
    getattr(os, "fdatasync", os.fsync)(fd)  # Windows and macOS have no fdatasync


async def _to_thread_whole(fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` in a thread, waited for to its end even when the caller is cancelled meanwhile. A
    cancelled `asyncio.to_thread` returns at once while its thread runs on: an `_open` left so took the
    partial's lock after its transfer had closed everything, and the job resumed after a Pause clicked at
    the start failed as "being downloaded by another process"; a `_finish` left so went on with descriptors
    the transfer's cleanup had closed (and the OS may have given to another file)."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    await background.until_done(work)
    return work.result()


def _jitter(opts: TransferOptions, attempt: int) -> float:
    base = min(opts.backoff_max_s, opts.backoff_s * 2 ** (attempt - 1))
    return base / 2 + random.uniform(0, base / 2)


class _OrderedHash:
    """The file's checksum, computed in file order from the bytes `written(pos)` says are on disk.

    `written(pos)` is the end of the gap-free stretch of written bytes that starts at `pos`. `restart()`
    starts over from byte zero (the transfer is rewriting bytes already hashed)."""

    def __init__(self, data: Path, spec: FileSpec, written: Callable[[int], int], *, block: int) -> None:
        self.data, self.size, self.block, self.written = data, spec.size, block, written
        self.lfs = spec.sha256 is not None
        self.pos = 0
        self._gen = 0
        self._hash = self._new()
        self._wake = asyncio.Event()

    def _new(self) -> Any:
        return hashlib.sha256() if self.lfs else hashlib.sha1(b"blob %d\0" % self.size)

    def wake(self) -> None:
        self._wake.set()

    def restart(self) -> None:
        self._gen += 1
        self.pos, self._hash = 0, self._new()
        self._wake.set()

    async def digest(self) -> str:
        """Returns once every byte is hashed; runs alongside the transfer."""
        while self.pos < self.size:
            self._wake.clear()
            n = min(self.written(self.pos) - self.pos, self.block)
            if n <= 0 or (n < self.block and self.pos + n < self.size):
                await self._wake.wait()  # a block's worth, or the end, before a thread hop
                continue
            gen, h = self._gen, self._hash
            await asyncio.to_thread(_hash_range, self.data, h, self.pos, n)
            if gen == self._gen:
                self.pos += n
        return str(self._hash.hexdigest())


def _hash_range(data: Path, h: Any, pos: int, n: int) -> None:
    # its own file object each time: an abandoned read (cancel) never races a later one over one offset
    with open(data, "rb") as f:
        f.seek(pos)
        while n > 0:
            block = f.read(min(n, MIB))
            if not block:
                raise OSError(errno.EIO, f"{data} is shorter than its recorded parts")
            h.update(block)  # hashlib lets go of the GIL for blocks this size
            n -= len(block)


def plan_parts(size: int, opts: TransferOptions) -> list[list[int]]:
    """[start, end (inclusive), done] per part."""
    if size <= 0:
        return [[0, -1, 0]]
    n = max(1, min(opts.parts, size // opts.min_part if size >= 2 * opts.min_part else 1))
    step = -(-size // n)
    return [[s, min(size, s + step) - 1, 0] for s in range(0, size, step)]


class Transfer:
    """Fetch `spec` from `url` into `repo_dir/blobs/<key>`; `on_bytes(n)` hears every chunk written
    (negative when a server without Range forces a restart from zero). `on_started()` is called once,
    before any `on_bytes`: when the first answer is in, or when the transfer ends without one, so the
    caller's bookkeeping runs while the bytes are already on their way."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        spec: FileSpec,
        repo_dir: Path,
        *,
        headers: Mapping[str, str],
        proxy: str | None = None,
        options: TransferOptions | None = None,
        on_bytes: Callable[[int], None] = lambda n: None,
        on_started: Callable[[], None] = lambda: None,
        describe: str = "",
    ) -> None:
        self.session = session
        self.url = url
        self.spec = spec
        self.repo_dir = repo_dir
        self.headers = dict(headers)
        self.proxy = proxy
        self.opts = options or TransferOptions()
        self.on_bytes = on_bytes
        self.on_started = on_started
        self._begun = False
        self.what = describe or spec.path
        self.dir = cache_layout.partial_dir(repo_dir, spec.key)
        self.blob = cache_layout.blob_path(repo_dir, spec.key)
        self.parts: list[list[int]] = []
        self.ranged = True
        self._fd = -1
        self._lock_fd = -1
        self._last_save = 0.0
        self._hash = _OrderedHash(self.dir / "data", spec, self._written, block=self.opts.hash_block)
        self._flushing: asyncio.Future[None] | None = None

    # --- state ------------------------------------------------------------------------------------

    @property
    def done(self) -> int:
        return sum(p[2] for p in self.parts)

    @property
    def hashed(self) -> int:
        """Bytes checksummed so far, a prefix of the file (it restarts at 0 when bytes are rewritten)."""
        return self._hash.pos

    def _written(self, pos: int) -> int:
        """The end of the bytes written without a gap from `pos` on."""
        for start, end, done in sorted(self.parts):
            if pos > end:
                continue
            if pos < start or start + done < pos:  # a gap, or bytes un-counted by a restart from zero
                return pos
            pos = start + done
            if pos <= end:
                return pos
        return pos

    def _load_state(self) -> None:
        try:
            st = json.loads((self.dir / "state.json").read_text())
            ok = st.get("size") == self.spec.size and st.get("key") == self.spec.key
            parts = [[int(a), int(b), int(c)] for a, b, c in st["parts"]] if ok else []
            data_size = (self.dir / "data").stat().st_size
        except (OSError, ValueError, KeyError, TypeError):
            parts, data_size = [], -1
        if parts and data_size == self.spec.size and all(0 <= p[2] <= p[1] - p[0] + 1 for p in parts):
            self.parts, self.ranged = parts, bool(st.get("ranged", True))
        else:
            self.parts, self.ranged = plan_parts(self.spec.size, self.opts), True

    def _save_state(self, *, force: bool = False) -> None:
        now = asyncio.get_running_loop().time()
        if not force and now - self._last_save < self.opts.save_every_s:
            return
        self._last_save = now
        doc = {"key": self.spec.key, "size": self.spec.size, "path": self.spec.path, "url": self.url,
               "ranged": self.ranged, "parts": self.parts}  # fmt: skip
        cache_layout.write_atomic(self.dir / "state.json", json.dumps(doc))
        if not force and self._fd >= 0 and (self._flushing is None or self._flushing.done()):
            # the disk takes the bytes while more arrive, so the fsync before the rename has little left
            self._flushing = asyncio.ensure_future(asyncio.to_thread(_datasync, self._fd))

    async def _flushed(self) -> None:
        """Until the background flush (if one runs) is over: the fd must outlive it."""
        if self._flushing is not None:
            flushing, self._flushing = self._flushing, None
            await asyncio.shield(flushing)

    def _open(self) -> None:
        cache_layout.inside_repo(self.repo_dir, self.dir)  # a planted symlink must not take the bytes away
        self.dir.mkdir(parents=True, exist_ok=True)
        cache_layout.inside_repo(self.repo_dir, self.dir)
        binary = getattr(os, "O_BINARY", 0)  # Windows would otherwise translate newlines
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | binary, 0o644)
        try:
            locks.lock(self._lock_fd, wait=False)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise DownloadBusyError(
                f"{self.what} is being downloaded by another Switchyard process (a running server or "
                "another `pull`); wait for it, or stop it first"
            ) from exc
        self._load_state()
        self._fd = os.open(self.dir / "data", os.O_RDWR | os.O_CREAT | binary, 0o644)
        if os.fstat(self._fd).st_size != self.spec.size:
            os.ftruncate(self._fd, self.spec.size)  # sparse: space is taken as bytes arrive

    def _close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._lock_fd = -1

    # --- the transfer ----------------------------------------------------------------------------

    async def run(self) -> Path:
        """The verified blob's path. Raises DownloadError (or a subclass) when the file cannot be had;
        cancellation leaves the partial in place for a later resume."""
        if self.blob.exists() and self.blob.stat().st_size == self.spec.size:
            return self.blob  # the same bytes are already here (another snapshot, another quant)
        try:
            await _to_thread_whole(self._open)
        except BaseException:
            self._close()  # what it opened before it failed or was cancelled: the lock must not outlive it
            raise
        hashing = asyncio.create_task(self._hash.digest())
        try:
            try:
                await self._fetch_all()
                self._begin()  # an empty file needs no request
            except Exception:
                self._begin()  # failed before any answer: the caller still hears that the file began
                raise
            finally:
                if self.dir.exists():
                    with contextlib.suppress(OSError):
                        self._save_state(force=True)
            got = await hashing
            await self._flushed()
            return await _to_thread_whole(self._finish, got)
        except SwitchyardError:
            raise
        except OSError as exc:
            raise self._os_error(exc) from exc
        finally:
            # not cut short by a second cancellation (a Pause, then the app quitting): the lock and the
            # descriptors are let go only after the threads that use them, and always
            hashing.cancel()
            try:
                await background.until_done(hashing)
                if self._flushing is not None:
                    await background.until_done(self._flushing)  # the fd must outlive its fsync
                    self._flushing = None
            finally:
                self._close()

    def _os_error(self, exc: OSError) -> SwitchyardError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFullError(
                f"the disk holding {self.repo_dir.parent} is full: {self.what} stopped at {self.done} of "
                f"{self.spec.size} bytes. Free some space and run the pull again; it continues from here"
            )
        return DownloadError(f"cannot write {self.what} under {self.dir}: {exc.strerror or exc}")

    async def _fetch_all(self) -> None:
        if self.ranged:
            tasks = [asyncio.create_task(self._part(i)) for i in range(len(self.parts))]
            try:
                await asyncio.gather(*tasks)
                return
            except _NoRange:
                pass
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # the server sends whole files only: one stream from zero (no resume, but no corruption)
            self._report(-self.done)
            self.ranged = False
            self.parts = [[0, self.spec.size - 1, 0]]
            self._hash.restart()
            self._save_state(force=True)
        await self._part(0)

    async def _part(self, i: int) -> None:
        attempt = 0
        while self.parts[i][0] + self.parts[i][2] <= self.parts[i][1]:
            before = self.parts[i][2]
            try:
                await self._fetch(i)
            except _Retryable as exc:
                attempt = 1 if self.parts[i][2] > before else attempt + 1
                if attempt > self.opts.retries:
                    raise DownloadError(
                        f"{self.what}: {exc} ({self.opts.retries} tries without progress); the bytes so far "
                        "are kept: run the pull again to continue"
                    ) from None
                await asyncio.sleep(_jitter(self.opts, attempt))

    async def _fetch(self, i: int) -> None:
        start, end, done = self.parts[i]
        pos = start + done
        headers = dict(self.headers, **{"Accept-Encoding": "identity"})
        if self.ranged:
            headers["Range"] = f"bytes={pos}-{end}"
        else:
            self._report(-done)  # no Range: every try starts at zero
            self.parts[i][2] = done = 0
            pos = 0
            self._hash.restart()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.opts.read_timeout_s)
        try:
            async with self.session.get(self.url, headers=headers, proxy=self.proxy, timeout=timeout) as r:
                self._check_status(r, pos)
                self._begin()
                async for chunk in r.content.iter_chunked(self.opts.chunk):
                    room = end + 1 - pos
                    if len(chunk) > room:
                        chunk = chunk[:room]
                    # a page-cache write of one chunk: cheaper inline than a thread hop per chunk
                    _write_at(self._fd, chunk, pos)
                    pos += len(chunk)
                    self.parts[i][2] += len(chunk)
                    self._report(len(chunk))
                    self._hash.wake()
                    self._save_state()
                    if pos > end:
                        break
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise _Retryable(f"connection lost ({type(exc).__name__})") from exc
        if pos <= end:
            raise _Retryable("the connection closed early")

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            self.on_started()
            self.on_bytes(0)

    def _report(self, n: int) -> None:
        self._begin()
        self.on_bytes(n)

    def _check_status(self, r: aiohttp.ClientResponse, pos: int) -> None:
        if r.status == 206 and self.ranged:
            got = r.headers.get("Content-Range", "")
            if got.startswith(f"bytes {pos}-"):
                return
            raise _NoRange()
        if r.status == 200:
            if self.ranged:
                raise _NoRange()
            return
        if r.status == 429 or r.status >= 500:
            raise _Retryable(f"the hub answered {r.status}")
        code = r.headers.get("X-Error-Code", "")
        if code == "GatedRepo":
            raise HubGatedError(
                f"{self.what}: the repository is gated; accept its license on the hub while logged in, then "
                "add a token with `switchyard hub login` (or set HF_TOKEN)"
            )
        if r.status in (401, 403):
            raise HubAuthError(f"{self.what}: the hub refused access ({r.status}); add or check the token")
        if r.status == 404:
            raise HubFileNotFoundError(f"{self.what} is not on the hub at this commit ({code or 404})")
        raise DownloadError(f"{self.what}: the hub answered {r.status}")

    # --- verification ----------------------------------------------------------------------------

    def _finish(self, got: str) -> Path:
        """Land the bytes whose in-order checksum is `got`, or delete them if it is not the published one."""
        os.fsync(self._fd)
        if self.spec.sha256 is not None:
            kind, expected = "sha256", self.spec.sha256
        else:
            kind, expected = "git oid", self.spec.oid or ""
        if got != expected:
            self._close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise ChecksumMismatchError(
                f"{self.what} is corrupt: expected {kind} {expected}, got {got}. The bad bytes were deleted; "
                "retry the pull"
            )
        os.replace(self.dir / "data", cache_layout.inside_repo(self.repo_dir, self.blob))
        self._close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.blob


def remove_partial(repo_dir: Path, spec: FileSpec) -> None:
    """Delete a file's partial bytes (cancel); a spec with an unsafe checksum never had any."""
    with contextlib.suppress(SwitchyardError):
        shutil.rmtree(cache_layout.partial_dir(repo_dir, spec.key), ignore_errors=True)


def partial_bytes(repo_dir: Path, spec: FileSpec) -> int:
    """Bytes already written for `spec` by an earlier run (0 when none, unreadable, or unsafe)."""
    try:
        st = json.loads((cache_layout.partial_dir(repo_dir, spec.key) / "state.json").read_text())
        if st.get("size") != spec.size:
            return 0
        return sum(int(p[2]) for p in st["parts"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, SwitchyardError):
        return 0
