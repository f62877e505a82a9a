"""Every MCP tool call, in audit.db's `mcp_calls` table (beside the safety verdicts of app/safety/audit.py):
the server, tool, arguments, who asked (the API key's name), how long it took, the result's size, and the
outcome (ok, error, denied). /api/mcp/calls reads it."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mcp_calls (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    key_name TEXT,
    model TEXT NOT NULL,
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    outcome TEXT NOT NULL,
    seconds REAL NOT NULL,
    result_bytes INTEGER NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS mcp_calls_at ON mcp_calls(at);
"""
_COLUMNS = "at, key_name, model, server, tool, arguments, outcome, seconds, result_bytes, error"


@dataclass(frozen=True)
class ToolCallRecord:
    model: str
    server: str
    tool: str
    arguments: str
    outcome: str  # ok | error | denied
    seconds: float = 0.0
    result_bytes: int = 0
    key_name: str | None = None
    error: str | None = None
    at: float = 0.0  # 0: now

    def public(self) -> dict[str, Any]:
        return asdict(self)


class ToolCallLog:
    """The MCP call log in `path` (the audit database; created on first use)."""

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

    def add(self, record: ToolCallRecord) -> None:
        r = record
        with self._db() as con:
            con.execute(
                f"INSERT INTO mcp_calls ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r.at or time.time(),
                    r.key_name,
                    r.model,
                    r.server,
                    r.tool,
                    r.arguments,
                    r.outcome,
                    r.seconds,
                    r.result_bytes,
                    r.error,
                ),
            )

    def recent(self, *, limit: int = 100) -> list[ToolCallRecord]:
        if not self.path.exists():
            return []
        with self._db() as con:
            rows = con.execute(
                f"SELECT {_COLUMNS} FROM mcp_calls ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [
            ToolCallRecord(
                at=r[0],
                key_name=r[1],
                model=r[2],
                server=r[3],
                tool=r[4],
                arguments=r[5],
                outcome=r[6],
                seconds=r[7],
                result_bytes=r[8],
                error=r[9],
            )
            for r in rows
        ]
