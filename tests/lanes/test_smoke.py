"""Smoke tests (app/lanes/smoke.py): a model's first ready lane on its files answers one short request.

Real llama.cpp engines on tiny generated models; results kept in a real library.db and read back through
GET /api/library and `switchyard ls`. The failing model is a generated one whose chat template refuses
the smoke test's prompt: it loads, and the engine answers the request with an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from app.core.events import Event
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.smoke import PROMPT
from app.library.db import SCHEMA_VERSION, Database, migrate
from app.library.model import FileInfo, ModelEntry
from app.library.store import Library, SmokeResult
from app.runtime import Runtime
from app.server.app import make_app
from tests.conftest import REPO, link_models
from tests.support.asyncwait import until
from tests.support.tinymodels import CHATML, TinySpec, write_tiny_gguf

# a template llama.cpp accepts at load (its probes never send this prompt) that refuses the smoke prompt
PICKY = (
    f"{{% if messages[-1]['content'] == '{PROMPT}' %}}"
    "{{ raise_exception('this model refuses that prompt') }}{% endif %}" + CHATML
)


def _runtime(models: Path) -> Runtime:
    return Runtime(
        settings=Settings.flat(models_dirs=(models,), plan_memory=False, monitor_interval_s=0),
        paths=Paths.from_env(),
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=dict(os.environ), capture_output=True, text=True
    )


async def _listed(client: TestClient[Any, Any]) -> dict[str, dict[str, Any]]:
    r = await client.get("/api/library")
    assert r.status == 200
    return {m["id"]: m for m in (await r.json())["models"]}


async def _result(rt: Runtime, model: str, *, after: float = 0.0) -> SmokeResult:
    def fresh() -> SmokeResult | None:
        got = rt.library.smoke(model).get(model)
        return got if got is not None and got.at > after else None

    found: SmokeResult = await until(fresh, limit=60, what=f"the smoke test of {model}")
    return found


async def _reload(rt: Runtime, model: str) -> None:
    """Unload and load again, until the new lane's ready hook has run (it stamps last_used_at)."""
    before = rt.library.rows(model)[0]["last_used_at"]
    await rt.supervisor.unload(model)
    await rt.supervisor.ensure(model)
    await until(lambda: rt.library.rows(model)[0]["last_used_at"] != before, what="the ready hook")
    await asyncio.sleep(0.5)  # room for a smoke test that should not run


async def test_chat_and_embedding_models_pass_once_and_are_listed(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    rt = _runtime(models)
    t0 = time.time()
    async with TestClient(TestServer(make_app(rt))) as client:
        assert (await _listed(client))["tiny"]["smoke"] is None  # never loaded: no test yet

        lane = await rt.supervisor.ensure("tiny")
        chat = await _result(rt, "tiny")
        assert chat.ok and chat.request == "chat" and chat.lane == "llama.cpp", chat
        assert chat.detail.startswith("answered ") and chat.detail.endswith(" tokens)"), chat.detail
        assert t0 <= chat.at <= time.time() and 0 < chat.seconds < 60
        assert lane.in_flight == 0  # the smoke request is not a client request: never in in_flight
        assert any("smoke test passed (chat" in line for line in lane.ring.tail(50))

        await rt.supervisor.ensure("embed")
        vec = await _result(rt, "embed")
        assert vec.ok and vec.request == "embedding" and vec.detail == "a vector of 64 numbers", vec

        listed = await _listed(client)
        assert listed["tiny"]["smoke"] == chat.public() and listed["tiny"]["smoke"]["ok"] is True
        assert listed["embed"]["smoke"]["detail"] == "a vector of 64 numbers"

        # not repeated on a later load of the same files
        await _reload(rt, "tiny")
        assert rt.library.smoke("tiny")["tiny"] == chat

        # the command line, from library.db
        out = await asyncio.to_thread(_cli, "ls", "--json", "--models-dir", str(models))
        assert out.returncode == 0, out.stderr
        by_id = {m["id"]: m for m in json.loads(out.stdout)["models"]}
        assert by_id["tiny"]["smoke"] == chat.public() and by_id["embed"]["smoke"] == vec.public()
        table = (await asyncio.to_thread(_cli, "ls", "--models-dir", str(models))).stdout
        assert "SMOKE" in table and "passed" in table and "smoke test failed" not in table

        # asked again explicitly: a new result
        task = rt.smoke.retest("tiny")
        assert task is not None
        again = await task
        assert again is not None and again.ok and again.at > chat.at
        # loading a loaded model through the admin API (the Library's Load) tests it again too
        r = await client.post("/api/models/tiny/load")
        assert r.status == 200, await r.text()
        third = await _result(rt, "tiny", after=again.at)
        assert third.ok and third.at > again.at


async def test_a_model_the_engine_refuses_fails_with_the_reason(tmp_path: Path) -> None:
    models = tmp_path / "models"
    picky = write_tiny_gguf(models / "picky.gguf", TinySpec(seed=5, chat_template=PICKY))
    rt = _runtime(models)
    async with TestClient(TestServer(make_app(rt))) as client:
        async with rt.bus.subscribe() as events:
            lane = await rt.supervisor.ensure("picky")  # it loads: only a request shows what is wrong
            failed = await _result(rt, "picky")
            seen = [ev.data for ev in _drain(events) if ev.kind == "library.changed"]
        assert seen == [{"model": "picky", "reason": "smoke", "smoke": failed.public()}]
        assert not failed.ok and failed.request == "chat"
        assert failed.detail.startswith("the engine answered 400: "), failed.detail
        assert "this model refuses that prompt" in failed.detail and "\n" not in failed.detail
        assert lane.available  # a failed smoke test leaves the lane serving
        shown = (await _listed(client))["picky"]["smoke"]
        assert shown["ok"] is False and shown["detail"] == failed.detail

        out = await asyncio.to_thread(_cli, "ls", "--models-dir", str(models))
        assert f"picky: smoke test failed: {failed.detail}" in out.stdout and "FAILED" in out.stdout

        # a failure is not retried on every load
        await _reload(rt, "picky")
        assert rt.library.smoke("picky")["picky"] == failed

        # a new file (the fixed template) is tested again at its first load
        await rt.supervisor.unload("picky")
        write_tiny_gguf(picky, TinySpec(seed=5, chat_template=CHATML))
        await asyncio.to_thread(rt.catalog.scan)
        assert (await _listed(client))["picky"]["smoke"] is None  # the old result speaks for the old file
        await rt.supervisor.ensure("picky")
        fixed = await _result(rt, "picky", after=failed.at)
        assert fixed.ok and fixed.identity != failed.identity, fixed
        assert (await _listed(client))["picky"]["smoke"]["ok"] is True


def _drain(q: asyncio.Queue[Event]) -> list[Event]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def _entry(path: Path, mtime_ns: int) -> ModelEntry:
    return ModelEntry(id="m", path=path, facts=None, problem=None, files=(FileInfo("m.gguf", 3, mtime_ns),))


def test_results_live_in_library_db_tied_to_the_files(tmp_path: Path) -> None:
    # a library.db of the previous schema keeps its rows and gains the smoke table
    path = tmp_path / "library.db"
    c = sqlite3.connect(path, isolation_level=None)
    migrate(c, target=SCHEMA_VERSION - 1)
    c.execute(
        "INSERT INTO models(id, format, kind, status, size, source, location, path, added_at) "
        "VALUES ('old', 'gguf', 'chat', 'ok', 3, 'models_dir', '/m', '/m/old.gguf', 1.5)"
    )
    c.close()
    lib = Library(Database(path))
    assert lib.db.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert [r["id"] for r in lib.rows()] == ["old"] and lib.smoke() == {}

    entry = _entry(tmp_path / "m.gguf", 7)
    assert entry.identity() == _entry(tmp_path / "m.gguf", 7).identity()
    assert entry.identity() != _entry(tmp_path / "m.gguf", 8).identity()  # a touched file is another one
    why = "the engine answered 500: x"
    result = SmokeResult(entry.identity(), False, 2.0, 0.25, "llama.cpp", "chat", why)
    assert not lib.put_smoke("m", result)  # no such model in the library: nothing kept
    lib.register(entry)
    assert lib.put_smoke("m", result)
    lib.close()
    lib = Library(Database(path))  # kept across opens
    assert lib.smoke() == {"m": result}
    assert result.public() == {
        "ok": False,
        "at": 2.0,
        "seconds": 0.25,
        "lane": "llama.cpp",
        "request": "chat",
        "detail": "the engine answered 500: x",
    }
    lib.forget("m")  # removing the model removes its result
    assert lib.smoke() == {}
    lib.close()
