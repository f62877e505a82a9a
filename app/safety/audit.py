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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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


class AuditLog:
    """The verdict log in `path` (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=10)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)
            with con:
                yield con
        finally:
            con.close()

    def add(self, *records: AuditRecord) -> None:
        rows = [
            (
                r.at or time.time(),
                r.key_name,
                r.model,
                r.judge,
                r.stage,
                r.verdict,
                json.dumps(list(r.categories)),
                r.latency_ms,
                int(r.blocked),
                r.reason,
                r.text,
            )
            for r in records
        ]
        with self._db() as con:
            con.executemany(
                "INSERT INTO verdicts (at, key_name, model, judge, stage, verdict, categories, latency_ms,"
                " blocked, reason, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
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
                "SELECT at, key_name, model, judge, stage, verdict, categories, latency_ms, blocked, reason,"
                f" text FROM verdicts {clause} ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [
            AuditRecord(
                at=r[0],
                key_name=r[1],
                model=r[2],
                judge=r[3],
                stage=r[4],
                verdict=r[5],
                categories=tuple(json.loads(r[6])),
                latency_ms=r[7],
                blocked=bool(r[8]),
                reason=r[9],
                text=r[10],
            )
            for r in rows
        ]
