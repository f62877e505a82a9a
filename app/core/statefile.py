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

import abc
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar

from app.core.errors import SettingsError, SwitchyardError
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


class Named(Protocol):
    """A record a `NamedRecords` file holds: found by its name, written as its public form."""

    @property
    def name(self) -> str: ...

    def public(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Named)


class NamedRecords(abc.ABC, Generic[R]):
    """A 0600 JSON file `{"version": 1, <key>: [record, ...]}` of records found by name (remotes.json,
    peers.json): read without a lock, changed only by `_update` (one locked read-modify-write, so the server,
    the CLI and the window may all change it at once and none of their changes is lost).

    A subclass says what it holds: `list_key` names the list (`peers`) and `noun` one record (`peer`);
    `missing_error` is the error for a name none has, which points to the `listing` command; `repair` says
    what to do with a file that cannot be read; `_record` reads one record's JSON."""

    list_key: ClassVar[str]
    noun: ClassVar[str]
    missing_error: ClassVar[type[SwitchyardError]]
    listing: ClassVar[str]
    repair: ClassVar[str]

    def __init__(self, path: Path) -> None:
        self.path = path

    @abc.abstractmethod
    def _record(self, data: Any) -> R:
        """One record from its JSON (a store that cannot say this cannot be made)."""

    def specs(self) -> list[R]:
        try:
            text = read_text(self.path)
        except OSError as exc:
            raise SettingsError(f"{self.path} cannot be read ({exc}); {self.repair}") from exc
        return [] if text is None else self._parse(text)

    def _parse(self, text: str) -> list[R]:
        try:
            return [self._record(d) for d in json.loads(text)[self.list_key]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SettingsError(
                f"{self.path} is damaged ({type(exc).__name__}: {exc}); {self.repair}"
            ) from exc

    def get(self, name: str) -> R:
        specs = self.specs()
        for spec in specs:
            if spec.name == name:
                return spec
        raise self.missing(name, specs)

    def missing(self, name: str, specs: list[R]) -> SwitchyardError:
        """The error for `name`, which none of `specs` has: it lists the names there are."""
        known = ", ".join(s.name for s in specs) or "none"
        return self.missing_error(
            f"no {self.noun} named {name!r} ({self.list_key}: {known}); see `{self.listing}`"
        )

    def _drop(self, name: str) -> R:
        """Take the record `name` out of the file and return it; `missing_error` when none has that name."""
        gone: list[R] = []

        def drop(specs: list[R]) -> list[R]:
            gone.extend(s for s in specs if s.name == name)
            if not gone:
                raise self.missing(name, specs)
            return [s for s in specs if s.name != name]

        self._update(drop)
        return gone[0]

    def keyring_user(self, name: str) -> str:
        """The keyring user (service "switchyard") that keeps the record `name`'s secret: `<noun>:<name>`."""
        return f"{self.noun}:{name}"

    def _update(self, change: Callable[[list[R]], Any]) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return update(
            self.path,
            lambda specs: change(specs or []),
            parse=self._parse,
            dump=lambda specs: dump_json({"version": 1, self.list_key: [s.public() for s in specs]}),
            mode=0o600,
        )
