"""Eval runs and their cases in SQLite (<home>/evals.db), read by `switchyard eval --history`, `/api/evals`
and the Library page (a model's last score). Each write is one short transaction in WAL mode, so the CLI
and the server can use the file at the same time; a run cut short stays recorded as unfinished.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.sqlitefile import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    suite TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    threshold REAL,
    score REAL,
    passed INTEGER,
    cases INTEGER NOT NULL DEFAULT 0,
    started REAL NOT NULL,
    finished REAL,
    note TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS case_results (
    run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    case_id TEXT NOT NULL,
    score REAL NOT NULL,
    weight REAL NOT NULL,
    reason TEXT NOT NULL,
    answer TEXT NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (run, case_id)
);
CREATE INDEX IF NOT EXISTS runs_by_model ON runs(model, id);
"""


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    case_id: str
    score: float
    weight: float
    reason: str
    answer: str
    seconds: float

    def public(self) -> dict[str, Any]:
        return {
            "id": self.case_id,
            "score": round(self.score, 4),
            "weight": self.weight,
            "reason": self.reason,
            "answer": self.answer,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    id: int
    model: str
    suite: str
    threshold: float | None
    score: float | None
    passed: bool | None
    cases: int
    started: float
    finished: float | None
    note: str

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "suite": self.suite,
            "threshold": self.threshold,
            "score": None if self.score is None else round(self.score, 4),
            "passed": self.passed,
            "cases": self.cases,
            "started": self.started,
            "finished": self.finished,
            "state": "finished" if self.finished is not None else "unfinished",
            "note": self.note,
        }


class EvalStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(SCHEMA)

    def _db(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path, foreign_keys=True)

    def start(self, *, model: str, suite: str, source: str, threshold: float | None) -> int:
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO runs (model, suite, source, threshold, started) VALUES (?, ?, ?, ?, ?)",
                (model, suite, source, threshold, time.time()),
            )
            return int(cur.lastrowid or 0)

    def add_case(self, run: int, result: CaseResult) -> None:
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO case_results VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run,
                    result.case_id,
                    result.score,
                    result.weight,
                    result.reason,
                    result.answer,
                    result.seconds,
                ),
            )
            db.execute("UPDATE runs SET cases = cases + 1 WHERE id = ?", (run,))

    def finish(self, run: int, *, score: float, passed: bool | None, note: str = "") -> None:
        with self._db() as db:
            db.execute(
                "UPDATE runs SET score = ?, passed = ?, finished = ?, note = ? WHERE id = ?",
                (score, None if passed is None else int(passed), time.time(), note, run),
            )

    def abandon(self, run: int, *, note: str) -> None:
        """A run cut short: its cases so far stay, it is never `finished`, and the note says why."""
        with self._db() as db:
            db.execute("UPDATE runs SET note = ? WHERE id = ?", (note, run))

    def runs(self, *, model: str | None = None, limit: int = 50) -> list[RunRecord]:
        query = "SELECT id, model, suite, threshold, score, passed, cases, started, finished, note FROM runs"
        args: tuple[Any, ...] = ()
        if model is not None:
            query += " WHERE model = ?"
            args = (model,)
        with self._db() as db:
            rows = db.execute(query + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_record(row) for row in rows]

    def run(self, run: int) -> RunRecord | None:
        with self._db() as db:
            row = db.execute(
                "SELECT id, model, suite, threshold, score, passed, cases, started, finished, note "
                "FROM runs WHERE id = ?",
                (run,),
            ).fetchone()
        return _record(row) if row else None

    def case_results(self, run: int) -> list[CaseResult]:
        with self._db() as db:
            rows = db.execute(
                "SELECT case_id, score, weight, reason, answer, seconds FROM case_results WHERE run = ? "
                "ORDER BY rowid",
                (run,),
            ).fetchall()
        return [
            CaseResult(case_id=r[0], score=r[1], weight=r[2], reason=r[3], answer=r[4], seconds=r[5])
            for r in rows
        ]

    def last_scores(self) -> dict[str, dict[str, Any]]:
        """Each model's latest finished run: what the Library page shows beside the model."""
        with self._db() as db:
            rows = db.execute(
                "SELECT id, model, suite, threshold, score, passed, cases, started, finished, note FROM runs "
                "WHERE finished IS NOT NULL AND id IN (SELECT MAX(id) FROM runs WHERE finished IS NOT NULL "
                "GROUP BY model)"
            ).fetchall()
        return {r[1]: _record(r).public() for r in rows}


def _record(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(
        id=row[0],
        model=row[1],
        suite=row[2],
        threshold=row[3],
        score=row[4],
        passed=None if row[5] is None else bool(row[5]),
        cases=row[6],
        started=row[7],
        finished=row[8],
        note=row[9],
    )


def dumps(records: list[RunRecord]) -> str:
    return json.dumps([r.public() for r in records], indent=2)
