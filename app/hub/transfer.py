"""One file's transfer: ranged parts in parallel, resumable across cuts and restarts, verified before use.

The partial lives beside the blob it becomes, in `blobs/<key>.incomplete.d/`:

    data        the file, sparse, each part written at its own offset
    state.json  the parts as [start, end, done]; `done` is only ever raised after its bytes were written,
                so after a kill the next run rewrites at most a little, never trusts unwritten bytes
    lock        flock'ed by the process writing, so a server and a `pull` never write the same partial

A cut connection, a timeout, a 5xx or a 429 is retried with exponential backoff and jitter, each part
continuing from its last written byte. A 200 answer to a Range request (a server or mirror that ignores
Range) is detected: the file is then fetched as one stream from byte zero instead of being corrupted.
When every part is in, the data is hashed (sha256 for LFS files, the git blob sha1 otherwise); only a
match is renamed to `blobs/<key>`. A mismatch deletes the bytes and raises ChecksumMismatchError.
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
from typing import Any

import aiohttp

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
from app.hub import cache_layout

try:  # POSIX; on Windows two writers are not kept apart (the GUI runs one manager anyway)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MIB = 1024 * 1024


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


def _jitter(opts: TransferOptions, attempt: int) -> float:
    base = min(opts.backoff_max_s, opts.backoff_s * 2 ** (attempt - 1))
    return base / 2 + random.uniform(0, base / 2)


def plan_parts(size: int, opts: TransferOptions) -> list[list[int]]:
    """[start, end (inclusive), done] per part."""
    if size <= 0:
        return [[0, -1, 0]]
    n = max(1, min(opts.parts, size // opts.min_part if size >= 2 * opts.min_part else 1))
    step = -(-size // n)
    return [[s, min(size, s + step) - 1, 0] for s in range(0, size, step)]


class Transfer:
    """Fetch `spec` from `url` into `repo_dir/blobs/<key>`; `on_bytes(n)` hears every chunk written
    (negative when a server without Range forces a restart from zero)."""

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
        self.what = describe or spec.path
        self.dir = cache_layout.partial_dir(repo_dir, spec.key)
        self.blob = cache_layout.blob_path(repo_dir, spec.key)
        self.parts: list[list[int]] = []
        self.ranged = True
        self._fd = -1
        self._lock_fd = -1
        self._last_save = 0.0

    # --- state ------------------------------------------------------------------------------------

    @property
    def done(self) -> int:
        return sum(p[2] for p in self.parts)

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

    def _open(self) -> None:
        cache_layout.inside_repo(self.repo_dir, self.dir)  # a planted symlink must not take the bytes away
        self.dir.mkdir(parents=True, exist_ok=True)
        cache_layout.inside_repo(self.repo_dir, self.dir)
        binary = getattr(os, "O_BINARY", 0)  # Windows would otherwise translate newlines
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | binary, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
        await asyncio.to_thread(self._open)
        try:
            self.on_bytes(0)
            try:
                await self._fetch_all()
            finally:
                if self.dir.exists():
                    with contextlib.suppress(OSError):
                        self._save_state(force=True)
            return await asyncio.to_thread(self._finish)
        except SwitchyardError:
            raise
        except OSError as exc:
            raise self._os_error(exc) from exc
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
            self.on_bytes(-self.done)
            self.ranged = False
            self.parts = [[0, self.spec.size - 1, 0]]
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
            self.on_bytes(-done)  # no Range: every try starts at zero
            self.parts[i][2] = done = 0
            pos = 0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.opts.read_timeout_s)
        try:
            async with self.session.get(self.url, headers=headers, proxy=self.proxy, timeout=timeout) as r:
                self._check_status(r, pos)
                async for chunk in r.content.iter_chunked(self.opts.chunk):
                    room = end + 1 - pos
                    if len(chunk) > room:
                        chunk = chunk[:room]
                    # a page-cache write of one chunk: cheaper inline than a thread hop per chunk
                    _write_at(self._fd, chunk, pos)
                    pos += len(chunk)
                    self.parts[i][2] += len(chunk)
                    self.on_bytes(len(chunk))
                    self._save_state()
                    if pos > end:
                        break
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise _Retryable(f"connection lost ({type(exc).__name__})") from exc
        if pos <= end:
            raise _Retryable("the connection closed early")

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

    def _finish(self) -> Path:
        os.fsync(self._fd)
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\0" % self.spec.size)
        with open(self.dir / "data", "rb") as f:
            while block := f.read(4 * MIB):
                sha256.update(block)
                if self.spec.sha256 is None:
                    sha1.update(block)
        if self.spec.sha256 is not None:
            kind, expected, got = "sha256", self.spec.sha256, sha256.hexdigest()
        else:
            kind, expected, got = "git oid", self.spec.oid or "", sha1.hexdigest()
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
