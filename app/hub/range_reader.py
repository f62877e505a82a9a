"""Reading the start of files on the hub with HTTP Range requests, cached by (repo, commit, path).

A GGUF header is read by asking for the first 256 KiB and doubling the range while the header goes on
(`app.formats.gguf_header.header_end` says how far it goes), appending each new range to what is already
here; the whole file is never asked for, and a header past `cap` bytes stops with a clear error. A safetensors
header is its 8-byte length and that much JSON. Small files (README.md, config.json) are read whole up to a
limit.

Reads are cached under SWITCHYARD_HOME/cache/hub-reads. A commit never changes, so an entry never goes
stale; an entry that does not check out (its recorded length or sha256 differs, or its record is unreadable)
is ignored and written again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from app.core.errors import HeaderReadError, HubFileNotFoundError
from app.formats.gguf_header import NeedMore, header_end
from app.formats.gguf_meta import GGUFProblem
from app.hub import client, safe_names
from app.hub.config import HubConfig
from app.hub.errors import hub_errors

KIB = 1024
MIB = 1024 * KIB
FIRST_READ = 256 * KIB
HEADER_CAP = 128 * MIB  # the largest real GGUF headers (262k-token vocabularies) are about 20 MiB
SMALL_FILE_LIMIT = 4 * MIB
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Prefix:
    data: bytes  # the bytes the header needs (not more)
    total: int  # the file's size on the hub
    fetched: int  # bytes fetched from the hub for this read (0 on a cache hit)


class ReadCache:
    """Immutable entries keyed by (repo, commit, path, kind): `<key>.bin` plus a `<key>.json` record."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def immutable(commit: str) -> bool:
        """Only a full commit sha names content that never changes; a branch name is not cached."""
        return _SHA.fullmatch(commit) is not None

    def _key(self, repo: str, commit: str, path: str, kind: str) -> str:
        return hashlib.sha256(f"{repo}\0{commit}\0{path}\0{kind}".encode()).hexdigest()[:40]

    def get(self, repo: str, commit: str, path: str, kind: str) -> tuple[bytes, int] | None:
        """(data, file size on the hub), or None when absent or not intact."""
        if not self.immutable(commit):
            return None
        key = self._key(repo, commit, path, kind)
        try:
            record = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
            data = (self.root / f"{key}.bin").read_bytes()
            ok = (
                record["repo"] == repo
                and record["commit"] == commit
                and record["path"] == path
                and record["length"] == len(data)
                and record["sha256"] == hashlib.sha256(data).hexdigest()
            )
            return (data, int(record["total"])) if ok else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, repo: str, commit: str, path: str, kind: str, data: bytes, total: int) -> None:
        if not self.immutable(commit):
            return
        key = self._key(repo, commit, path, kind)
        record = {
            "repo": repo,
            "commit": commit,
            "path": path,
            "kind": kind,
            "length": len(data),
            "total": total,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # data first, the record last: a record only ever describes data already in place
            _atomic_write(self.root / f"{key}.bin", data)
            _atomic_write(self.root / f"{key}.json", json.dumps(record).encode())
        except OSError:
            pass  # a cache that cannot be written costs a re-read next time, nothing more


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class RangeReader:
    """Range reads of files at a commit, through huggingface_hub's shared client (proxy, offline)."""

    def __init__(
        self, config: HubConfig, cache: ReadCache, *, first: int = FIRST_READ, cap: int = HEADER_CAP
    ) -> None:
        self.config = config
        self.cache = cache
        self.first = first
        self.cap = cap

    def _get(self, repo: str, commit: str, path: str, start: int, end: int) -> tuple[bytes, int | None]:
        """Bytes start..end (inclusive) and the file's size; never reads past `end`, even when the server
        ignores Range and sends the whole file."""
        url = hf_hub_url(repo, path, revision=commit, endpoint=self.config.endpoint)
        headers = build_hf_headers(
            token=client.token_arg(self.config), headers={"Range": f"bytes={start}-{end}"}
        )
        with hub_errors(self.config, repo=repo, path=path):
            sess = client.session(self.config)
            with sess.stream("GET", url, headers=headers) as r:
                if r.status_code == 416:
                    return b"", _total(r.headers.get("Content-Range"))
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                skip = start if r.status_code == 200 else 0
                want = end - start + 1
                total = _total(r.headers.get("Content-Range")) if r.status_code == 206 else None
                if total is None and r.headers.get("Content-Length", "").isdigit() and r.status_code == 200:
                    total = int(r.headers["Content-Length"])
                out = bytearray()
                for chunk in r.iter_bytes():
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                    out += chunk
                    if len(out) >= want:
                        break
                return bytes(out[:want]), total

    def read_prefix(
        self,
        repo: str,
        commit: str,
        path: str,
        *,
        kind: str,
        needs: Callable[[bytes], int | NeedMore | GGUFProblem],
    ) -> Prefix:
        """The leading bytes `needs` asks for, grown by doubling from `first` up to `cap`."""
        cached = self.cache.get(repo, commit, path, kind)
        if cached is not None:
            return Prefix(cached[0], cached[1], 0)
        data = b""
        total: int | None = None
        length = self.first
        fetched = 0
        while True:
            if total is None or len(data) < total:
                chunk, size = self._get(repo, commit, path, len(data), length - 1)
                fetched += len(chunk)
                total = size if size is not None else total
                data += chunk
            verdict = needs(data)
            if isinstance(verdict, GGUFProblem):
                raise HeaderReadError(f"{path} in {repo}: {verdict.reason}")
            if isinstance(verdict, int):
                data = data[:verdict]
                break
            if total is not None and len(data) >= total:
                raise HeaderReadError(
                    f"{path} in {repo} ends ({total} bytes) before its header does; the file on the hub is "
                    "truncated or not what its name says"
                )
            if verdict.at_least > self.cap:
                raise HeaderReadError(
                    f"the header of {path} in {repo} needs more than {self.cap // MIB} MiB (at least "
                    f"{verdict.at_least} bytes); it was not read to spare the download. Download the file "
                    "and check it locally (`switchyard explain PATH`)"
                )
            length = min(max(length * 2, verdict.at_least), self.cap)
        if total is None:
            total = len(data)
        self.cache.put(repo, commit, path, kind, data, total)
        return Prefix(data, total, fetched)

    def gguf_header(self, repo: str, commit: str, path: str) -> Prefix:
        return self.read_prefix(repo, commit, path, kind="gguf-header", needs=header_end)

    def safetensors_header(self, repo: str, commit: str, path: str) -> dict[str, object]:
        prefix = self.read_prefix(repo, commit, path, kind="safetensors-header", needs=_safetensors_needs)
        try:
            header = json.loads(prefix.data[8:])
        except ValueError as exc:
            raise HeaderReadError(f"the safetensors header of {path} in {repo} is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise HeaderReadError(f"the safetensors header of {path} in {repo} is not a JSON object")
        return header

    def small_file(
        self, repo: str, commit: str, path: str, *, limit: int = SMALL_FILE_LIMIT
    ) -> tuple[bytes, bool]:
        """A small file whole (README.md, config.json): (data, truncated at `limit`)."""
        cached = self.cache.get(repo, commit, path, "small")
        if cached is not None:
            return cached[0], len(cached[0]) < cached[1]
        data, total = self._get(repo, commit, path, 0, limit - 1)
        total = total if total is not None else len(data)
        self.cache.put(repo, commit, path, "small", data, total)
        return data, len(data) < total

    def optional_small_file(
        self, repo: str, commit: str, path: str, *, limit: int = SMALL_FILE_LIMIT
    ) -> bytes | None:
        try:
            return self.small_file(repo, commit, path, limit=limit)[0]
        except HubFileNotFoundError:
            return None


def _total(content_range: str | None) -> int | None:
    """The size in `bytes a-b/size`; None when absent or `*`."""
    if not content_range or "/" not in content_range:
        return None
    size = content_range.rsplit("/", 1)[1].strip()
    return int(size) if size.isdigit() else None


def _safetensors_needs(data: bytes) -> int | NeedMore | GGUFProblem:
    if len(data) < 8:
        return NeedMore(8)
    n = struct.unpack("<Q", data[:8])[0]
    if n > HEADER_CAP:
        return GGUFProblem(f"its header claims {n} bytes, which is not a safetensors file")
    return 8 + n if len(data) >= 8 + n else NeedMore(8 + n)


def sparse_copy(folder: Path, name: str, header: bytes, size: int) -> Path:
    """A local stand-in for a file on the hub: its header bytes, then zeros up to its real size. The file is
    sparse (the zeros take no disk on Linux and macOS), so the local GGUF readers see the real layout.
    `name` comes from the hub: it must be one safe file name, and the file stays inside `folder`."""
    safe_names.check_file_part("a hub header read", name)
    path = safe_names.inside(folder, folder / name, repo="a hub header read")
    with path.open("wb") as f:
        f.write(header)
        f.truncate(max(size, len(header)))
    return path
