"""Small JSON state files (keys, remotes, pins, settings the window writes, download jobs), changed safely.

`update(path, change)` is the only way these files are rewritten: it takes an exclusive lock on a sibling
lock file (`.NAME.lock`), reads the file as it is now, applies `change`, and writes the result to a temp
file in the same folder, fsyncs it, renames it over the old one and fsyncs the folder. So:

- two writers never both read the same old state (no lost update), whether they are threads of one
  process or separate processes (the server, the CLI, the window);
- when `update` returns, the new state is on disk (it survives a crash or a power cut);
- a reader needs no lock: the rename is atomic, so it sees the old file or the new, never half of one.

The lock is `fcntl.flock` on POSIX and `msvcrt.locking` on Windows (core/platform/locks.py), on a
descriptor opened per call: both belong to the descriptor, so two threads of one process exclude each
other too. On Windows the rename is retried while another process holds the old file open.
The lock file is never deleted (deleting it would let two writers lock two different files).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from app.core.platform import files, locks

__all__ = ["DELETE", "KEEP", "dump_json", "locked", "read_text", "remove", "update", "write_atomic"]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"statefile.{self.name}"


KEEP: Final = _Marker("KEEP")  # returned by a change: leave the file as it is (nothing changed)
DELETE: Final = _Marker("DELETE")  # returned by a change: remove the file


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of state file `path` (not reentrant: never nest two on one path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        locks.lock(fd)
        try:
            yield
        finally:
            locks.unlock(fd)
    finally:
        os.close(fd)


def read_text(path: Path) -> str | None:
    """The file's text, or None when there is none. Needs no lock (files are replaced atomically)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace `path` with `text` durably (temp file, fsync, rename, fsync of the folder). Call it under
    `locked(path)` when the text was computed from the file's old content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600; set what this file should be
        files.replace(tmp, path)  # retried on Windows while a reader holds the old file open
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    files.fsync_dir(path.parent)


def remove(path: Path) -> None:
    """Delete `path` (if present) durably; call it under `locked(path)`."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    files.fsync_dir(path.parent)


def dump_json(doc: Any) -> str:
    return json.dumps(doc, indent=2) + "\n"


def update(
    path: Path,
    change: Callable[[Any], Any],
    *,
    parse: Callable[[str], Any] = json.loads,
    dump: Callable[[Any], str] = dump_json,
    mode: int = 0o644,
    lock_of: Path | None = None,
) -> Any:
    """Locked read-modify-write of `path`: `change` gets the parsed current document (None when the file
    does not exist) and returns the new one, KEEP (write nothing) or DELETE (remove the file); an exception
    from `parse` or `change` writes nothing and propagates. Returns what `change` returned. When it
    returns, the new state is durable. `change` must not call `update` on the same lock. `lock_of` shares
    one lock among many small files (download jobs): the lock of that path is taken instead."""
    with locked(lock_of or path):
        text = read_text(path)
        new = change(None if text is None else parse(text))
        if new is KEEP:
            return new
        if new is DELETE:
            remove(path)
        else:
            write_atomic(path, dump(new), mode=mode)
        return new
