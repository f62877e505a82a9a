"""Eval suites are read only from the suites folder (issue 33): a path elsewhere, a `..` and a symlink out
are refused unread with where suites go, never quoting the file; a client's own file arrives as text
(`suite_text`, what `switchyard eval --suite FILE` sends); a gate's file is copied into the folder.

The folder rules on `load_suite` itself, then a real in-process server (a real llama.cpp lane) for the
admin routes that name a suite: POST /api/evals and the eval job."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.core.paths import Paths
from app.core.settings import Settings
from app.quality.score import SuiteError
from app.quality.suite import load_suite, placed_suite
from app.runtime import Runtime
from app.server.app import make_app
from tests.conftest import link_models

SECRET = "hunter2-SECRET"
PINNED = {"grammar": 'root ::= "42"', "max_tokens": 4}
SUITE = {
    "name": "pinned",
    "cases": [{"id": "sum", "prompt": "17+25?", "expect": {"number": 42}, "params": PINNED}],
}


def _foreign(tmp_path: Path) -> Path:
    """A file outside the folder, named like a suite, holding a secret on a line YAML cannot parse."""
    creds = tmp_path / "elsewhere" / "creds.yaml"
    creds.parent.mkdir(parents=True, exist_ok=True)
    creds.write_text(f'user: admin\npassword: "{SECRET}" : oops\n')
    return creds


def test_only_the_suites_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "mine.json").write_text(json.dumps(SUITE))
    assert load_suite("mine.json", folder=folder).name == "pinned"
    assert load_suite("mine", folder=folder).cases[0].id == "sum"  # the suffix may be left out
    assert load_suite(str(folder / "mine.json"), folder=folder).name == "pinned"
    assert load_suite("arithmetic", folder=folder).name == "arithmetic"  # the built-ins stay
    creds = _foreign(tmp_path)
    (folder / "link.yaml").symlink_to(creds)
    for ref in (str(creds), "../elsewhere/creds.yaml", "link.yaml", "~/../../etc/passwd"):
        with pytest.raises(SuiteError) as e:
            load_suite(ref, folder=folder)
        assert f"only from its suites folder, {folder.resolve()}" in e.value.message, e.value.message
        assert SECRET not in e.value.message and "admin" not in e.value.message
    # the CLI, reading a user's own file for them, is not bound to the folder (and still quotes nothing)
    with pytest.raises(SuiteError, match="line 2") as e:
        load_suite(str(creds))
    assert SECRET not in e.value.message


def test_a_gates_file_is_copied_into_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "home" / "suites"
    mine = tmp_path / "work" / "gate.json"
    mine.parent.mkdir()
    mine.write_text(json.dumps(SUITE))
    assert placed_suite(str(mine), folder=folder) == "gate.json"
    assert (folder / "gate.json").read_text() == mine.read_text()
    assert placed_suite(str(mine), folder=folder) == "gate.json"  # the same suite again: fine
    assert placed_suite("arithmetic", folder=folder) == "arithmetic"
    mine.write_text(json.dumps({**SUITE, "name": "other"}))
    with pytest.raises(SuiteError, match="another suite of the same name"):
        placed_suite(str(mine), folder=folder)
    with pytest.raises(SuiteError, match="line 2"):  # checked before it is copied
        placed_suite(str(_foreign(tmp_path)), folder=folder)
    assert not (folder / "creds.yaml").exists()


async def test_the_server_refuses_a_suite_outside_its_folder(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    settings = Settings.flat(plan_memory=False, monitor_interval_s=0, models_dirs=(models,))
    rt = Runtime(settings=settings, paths=Paths(home=tmp_path / "home"))
    creds = _foreign(tmp_path)
    async with TestClient(TestServer(make_app(rt))) as client:
        await asyncio.to_thread(rt.catalog.scan)
        for route, extra in (("/api/evals", {}), ("/api/jobs", {"kind": "eval"})):
            for ref in (str(creds), "../elsewhere/creds.yaml"):
                r = await client.post(route, json={"model": "tiny", "suite": ref, **extra})
                text = await r.text()
                assert r.status == 400, text
                err = (await r.json())["error"]
                assert err["code"] == "invalid_suite" and str(rt.paths.suites) in err["message"], err
                assert SECRET not in text and "admin" not in text
        # a client's own suite, sent as text, runs on the real lane
        sent = {"model": "tiny", "suite": "mine.json", "suite_text": json.dumps(SUITE)}
        r = await client.post("/api/evals", json=sent)
        assert r.status == 200, await r.text()
        assert (await r.json())["score"] == 1.0
        r = await client.post("/api/evals", json={**sent, "suite_text": 7})
        assert r.status == 400 and (await r.json())["error"]["param"] == "suite_text"
