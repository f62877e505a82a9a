"""library.db: the SQLite file behind the catalog, its schema and its migrations.

Crash safety comes from SQLite itself: WAL journal, `synchronous=NORMAL` (FULL on the migration), and every
write inside one `transaction()`, so a process killed mid-write leaves the last committed state. Each
migration runs in its own transaction and bumps `PRAGMA user_version` inside it.

Opening a file that is not SQLite, or fails `PRAGMA quick_check`, never overwrites it: it is renamed to
`library.db.corrupt-<unix time>` (with its -wal/-shm), a fresh file is created and rebuilt from the sources
on the next scan, and `Library.notices` says so. A file from a newer Switchyard is refused untouched.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from app.core.errors import LibraryError

SQLITE_MAGIC = b"SQLite format 3\x00"


def _run(db: sqlite3.Connection, script: str) -> None:
    # statement by statement: executescript() would COMMIT the migration's transaction first
    for stmt in script.split(";"):
        if stmt.strip():
            db.execute(stmt)


def _v1(db: sqlite3.Connection) -> None:
    _run(
        db,
        """
        CREATE TABLE models (
            id TEXT PRIMARY KEY,
            format TEXT NOT NULL,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            problem TEXT,
            facts TEXT,
            size INTEGER NOT NULL DEFAULT 0,
            source TEXT NOT NULL,
            location TEXT NOT NULL,
            path TEXT NOT NULL,
            digest TEXT NOT NULL DEFAULT '',
            added_at REAL NOT NULL
        );
        CREATE TABLE files (
            model_id TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
            rel_path TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT,
            mtime_ns INTEGER NOT NULL,
            PRIMARY KEY (model_id, rel_path)
        );
        CREATE TABLE origin (
            model_id TEXT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
            repo TEXT NOT NULL,
            revision TEXT,
            commit_hash TEXT,
            snapshot TEXT,
            history TEXT NOT NULL DEFAULT '[]'
        );
        CREATE TABLE headers (
            path TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            facts TEXT,
            problem TEXT
        );
        """,
    )


def _v2(db: sqlite3.Connection) -> None:
    _run(
        db,
        """
        ALTER TABLE models ADD COLUMN last_used_at REAL;
        CREATE TABLE pins (model_id TEXT PRIMARY KEY, lane TEXT NOT NULL);
        CREATE TABLE footprints (
            model_id TEXT PRIMARY KEY,
            file TEXT NOT NULL,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            at REAL NOT NULL,
            data TEXT NOT NULL
        );
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        """,
    )


def _v3(db: sqlite3.Connection) -> None:
    # measured speeds (app/library/speeds.py): per model, lane and device, the median of recent answers
    _run(
        db,
        """
        CREATE TABLE speeds (
            model_id TEXT NOT NULL,
            lane TEXT NOT NULL,
            device TEXT NOT NULL,
            prompt_tps REAL,
            gen_tps REAL NOT NULL,
            bytes_per_token INTEGER,
            samples INTEGER NOT NULL,
            recent TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (model_id, lane, device)
        );
        """,
    )


def _v4(db: sqlite3.Connection) -> None:
    # smoke tests (app/lanes/smoke.py): one per model, tied to the identity of the files it ran on
    _run(
        db,
        """
        CREATE TABLE smoke (
            model_id TEXT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
            identity TEXT NOT NULL,
            ok INTEGER NOT NULL,
            at REAL NOT NULL,
            seconds REAL NOT NULL,
            lane TEXT NOT NULL,
            request TEXT NOT NULL,
            detail TEXT NOT NULL
        );
        """,
    )


# index i holds the step from version i to i + 1; append only, never edit a released step
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_v1, _v2, _v3, _v4)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, *, target: int = SCHEMA_VERSION) -> int:
    """Bring `db` to `target`, one transaction per step; returns the version it started at."""
    start = int(db.execute("PRAGMA user_version").fetchone()[0])
    for version in range(start, target):
        db.execute("BEGIN IMMEDIATE")
        try:
            # re-read under the write lock: another process may have migrated meanwhile
            now = int(db.execute("PRAGMA user_version").fetchone()[0])
            if now > version:
                db.execute("COMMIT")
                continue
            MIGRATIONS[version](db)
            db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return start


def _connect(path: Path) -> sqlite3.Connection:
    # autocommit mode (isolation_level=None): transactions are explicit, see Library.transaction
    db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA busy_timeout = 10000")
    db.execute("PRAGMA foreign_keys = ON")
    return db


def _looks_corrupt(path: Path) -> str | None:
    """Why `path` is not a usable SQLite file, or None."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise LibraryError(f"cannot read {path}: {exc.strerror or exc}; check its permissions") from exc
    if head == b"":
        return None  # an empty file is a new database
    if head != SQLITE_MAGIC:
        return "it is not an SQLite database"
    try:
        db = _connect(path)
        try:
            rows = db.execute("PRAGMA quick_check").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"SQLite cannot read it ({exc})"
    if [r[0] for r in rows] != ["ok"]:
        return "SQLite's integrity check failed: " + "; ".join(str(r[0]) for r in rows[:3])
    return None


def _set_aside(path: Path) -> Path:
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}-{n}")
        n += 1
    path.rename(aside)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    return aside


class Database:
    """One connection to library.db, shared by the threads of this process under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notices: list[str] = []
        self._lock = threading.RLock()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            why = _looks_corrupt(path)
            if why is not None:
                aside = _set_aside(path)
                self.notices.append(
                    f"{path} could not be used ({why}); it was moved to {aside} and a new library is being "
                    "rebuilt from the models folders, the Hugging Face cache and the imported folder "
                    "(linked imports, --name ids and measured footprints are not recovered; re-run "
                    f"`switchyard import --link` for those). Delete {aside.name} once you no longer need it."
                )
        try:
            self.db = _connect(path)
            version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                self.db.close()
                raise LibraryError(
                    f"{path} is schema version {version}, newer than this Switchyard understands "
                    f"({SCHEMA_VERSION}); upgrade Switchyard, or move the file aside to start a new library"
                )
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
            migrate(self.db)
        except sqlite3.OperationalError as exc:
            raise LibraryError(f"cannot open {path}: {exc}; check that the folder is writable") from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it is committed, or none of it (also when the process dies)."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self.db.execute(sql, params).fetchall())

    def close(self) -> None:
        with self._lock:
            self.db.close()
