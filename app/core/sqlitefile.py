"""The small SQLite files beside the catalog (audit.db, evals.db): one connection per transaction.

Each is written by the server while the CLI or the window reads it, so it runs in WAL mode (readers do not
wait on the writer) and a busy file is waited on for up to 10 s before `sqlite3.OperationalError`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def transaction(path: Path, *, schema: str = "", foreign_keys: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to `path` (its folder made) for one transaction: committed when the block ends, rolled
    back when it raises, closed either way. `schema` (CREATE ... IF NOT EXISTS statements) runs first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as con:
        con.execute("PRAGMA journal_mode=WAL")
        if foreign_keys:
            con.execute("PRAGMA foreign_keys=ON")
        if schema:
            con.executescript(schema)
        with con:
            yield con
