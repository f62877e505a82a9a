"""Measured speeds are filed in batches (issue 35: a SQLite commit and a thread hand-off per answer were a
fixed cost of every request): a burst of answers is one transaction, every answer still counts in the
order it came, a lone answer is filed without anyone asking, and a server's end files what still waits."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from app.core.paths import Paths
from app.core.settings import Settings
from app.library.db import Database
from app.library.speeds import FLUSH_S, LoadKey, SpeedRecorder, SpeedStore
from app.library.store import Library
from app.runtime import Runtime

MIB = 1024 * 1024
ANSWER = b'"timings":{"prompt_per_second":100.0,"predicted_per_second":%d.0,"predicted_n":8}'


def _commits(db: sqlite3.Connection) -> list[str]:
    """The COMMIT statements run on `db` from now on (SQLite's own trace of what it executed)."""
    seen: list[str] = []
    db.set_trace_callback(lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None)
    return seen


def test_a_burst_of_answers_is_one_commit_and_every_answer_counts(tmp_path: Path) -> None:
    lib = Library(Database(Paths(tmp_path).home / "library.db"))
    key = LoadKey("llama.cpp", "CPU", 100 * MIB, object())
    recorder = SpeedRecorder(SpeedStore(lib), where=lambda _m: key)
    commits = _commits(lib.db.db)

    async def burst() -> None:
        for n in range(10, 16):  # 10 is the load's first answer: shown alone, then replaced by 11
            recorder.note("m", ANSWER % n)
        assert SpeedStore(lib).of("m") == [], "filed before the rest of its burst could join it"
        await recorder.drain()

    try:
        asyncio.run(burst())
        (row,) = SpeedStore(lib).of("m")
        assert row.samples == 5 and row.gen_tps == 13.0 and not row.first_only  # the median of 11..15
        assert commits == ["COMMIT"], f"a burst of 6 answers took {len(commits)} commits"
    finally:
        lib.close()


def test_a_lone_answer_is_filed_after_the_batch_wait(tmp_path: Path) -> None:
    lib = Library(Database(Paths(tmp_path).home / "library.db"))
    key = LoadKey("llama.cpp", "CPU", 100 * MIB, object())
    recorder = SpeedRecorder(SpeedStore(lib), where=lambda _m: key)

    async def one() -> None:
        recorder.note("m", ANSWER % 7)
        for _ in range(int(20 / 0.05)):  # the recorder's own timer files it
            if SpeedStore(lib).of("m"):
                return
            await asyncio.sleep(0.05)

    try:
        asyncio.run(one())
        (row,) = SpeedStore(lib).of("m")
        assert row.gen_tps == 7.0 and row.first_only
    finally:
        lib.close()


async def test_the_runtime_files_what_waits_when_it_ends(tmp_path: Path) -> None:
    paths = Paths.from_env()
    paths.ensure()
    key = LoadKey("llama.cpp", "CPU", 100 * MIB, object())
    models = tmp_path / "models"
    models.mkdir()
    async with Runtime(
        settings=Settings.flat(models_dirs=(models,), monitor_interval_s=0), paths=paths
    ) as rt:
        rt.speeds.where = lambda _m: key
        rt.speeds.note("m", ANSWER % 9)
        rt.speeds.note("m", ANSWER % 12)
    assert FLUSH_S > 0  # so the two were still waiting for their batch when the runtime ended
    lib = Library(Database(paths.library_db))
    try:
        (row,) = SpeedStore(lib).of("m")
        assert row.samples == 1 and row.gen_tps == 12.0
    finally:
        lib.close()
