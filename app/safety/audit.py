"""audit.db: one row per verdict (and per judge failure), for `/api/audit` and the desktop.

A row holds the time, the key name, the model asked, the judge, the stage, the verdict (safe,
controversial, unsafe, error), the categories, the judge's latency and whether the text was refused. The
judged text is kept only when `policy.audit_text` is on. WAL, so the server writes while a reader reads.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core.sqlitefile import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    key_name TEXT,
    model TEXT NOT NULL,
    judge TEXT,
    stage TEXT NOT NULL,
    verdict TEXT NOT NULL,
    categories TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    blocked INTEGER NOT NULL,
    reason TEXT,
    text TEXT
);
CREATE INDEX IF NOT EXISTS verdicts_at ON verdicts(at);
"""


@dataclass(frozen=True)
class AuditRecord:
    model: str
    stage: str
    verdict: str
    judge: str | None = None
    key_name: str | None = None
    categories: tuple[str, ...] = ()
    latency_ms: float = 0.0
    blocked: bool = False
    reason: str | None = None  # a failed judge's error
    text: str | None = None
    at: float = 0.0  # 0: now

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "categories": list(self.categories)}


# the table's columns, each named as the AuditRecord field it holds (categories as JSON, blocked as 0/1)
_COLUMNS = (
    "at",
    "key_name",
    "model",
    "judge",
    "stage",
    "verdict",
    "categories",
    "latency_ms",
    "blocked",
    "reason",
    "text",
)


class AuditLog:
    """The verdict log in `path` (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _db(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path, schema=_SCHEMA)

    def add(self, *records: AuditRecord) -> None:
        stored = (
            {**asdict(r), "at": r.at or time.time(), "categories": json.dumps(list(r.categories))}
            for r in records
        )
        with self._db() as con:
            con.executemany(
                f"INSERT INTO verdicts ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                [tuple(row[c] for c in _COLUMNS) for row in stored],
            )

    def recent(
        self, *, limit: int = 100, verdict: str | None = None, since: float | None = None
    ) -> list[AuditRecord]:
        """The newest `limit` rows first, optionally of one verdict and after a Unix time."""
        if not self.path.exists():
            return []
        where: list[str] = []
        args: list[Any] = []
        if verdict is not None:
            where.append("verdict = ?")
            args.append(verdict)
        if since is not None:
            where.append("at > ?")
            args.append(since)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._db() as con:
            rows = con.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM verdicts {clause} ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_record(r) for r in rows]


def _record(row: tuple[Any, ...]) -> AuditRecord:
    d = dict(zip(_COLUMNS, row, strict=True))
    return AuditRecord(
        **{**d, "categories": tuple(json.loads(d["categories"])), "blocked": bool(d["blocked"])}
    )
