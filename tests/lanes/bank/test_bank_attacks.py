"""The session bank attacked on purpose (issue 33): an adapter request never restores its base model's
checkpoint (nor the other way round), an index replaced by a directory is set aside instead of turning
/api/bank into a 500, and slot files a failed save left behind are counted by nothing, so they are swept."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from app.lanes.bank.sessions import STRAY_AGE_S, BankStore, bank_clear, bank_dir, bank_summary
from tests.conftest import ServerProcess, link_models, wait_gone
from tests.support.loragen import write_tiny_lora
from tests.support.tinymodels import CHAT

PINNED = {"grammar": 'root ::= "the answer is 42"'}
CONVO = [
    {"role": "system", "content": "You keep long notes. " * 12},
    {"role": "user", "content": "Tell me about rivers. " * 10},
    {"role": "assistant", "content": "the answer is 42"},
    {"role": "user", "content": "More."},
]


def _bank(server: ServerProcess) -> dict[str, Any]:
    r = httpx.get(server.url + "/api/bank", timeout=10)
    r.raise_for_status()
    return r.json()


def _stopped(server: ServerProcess) -> bool:
    lanes = httpx.get(server.url + "/api/lanes", timeout=10).json()["lanes"]
    return all(ln["state"] == "stopped" for ln in lanes if ln["model"] == "tiny")


def _wait(check: Any, what: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_adapter_request_never_restores_the_base_models_checkpoint(
    tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    write_tiny_lora(models / "my-adapter.gguf", CHAT)
    home = tmp_path / "home"
    home.mkdir()
    lora = [{"file": "my-adapter.gguf", "scale": 0.5}]
    settings = {"idle_ttl_s": 3, "parallel": 2, "model_overrides": {"tiny": {"lora": lora}}}
    (home / "settings.json").write_text(json.dumps(settings))
    server = ServerProcess(home, models).wait_ready()
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        ask = lambda model: client.chat.completions.create(  # noqa: E731
            model=model, messages=CONVO, max_tokens=8, extra_body=PINNED
        )
        ask("tiny")
        _wait(lambda: _stopped(server) and _bank(server)["checkpoints"], "the base's conversation banked")
        ask("tiny+my-adapter")  # the same messages through the adapter: another cache
        counters = _bank(server)["counters"]
        assert counters["restores"] == 0 and counters["hits"] == 0, counters
        _wait(lambda: _stopped(server) and len(_bank(server)["checkpoints"]) == 2, "the adapter's banked")
        ask("tiny")  # the control: the base's own checkpoint still comes back
        assert _bank(server)["counters"]["restores"] == 1
    finally:
        pids = server.engine_pids()
        server.stop()
        wait_gone(pids, 5)


def test_an_index_replaced_by_a_directory_is_set_aside(tmp_path: Path) -> None:
    index = bank_dir(tmp_path) / "bank.db"
    (index / "inside").mkdir(parents=True)
    summary = bank_summary(tmp_path, budget_bytes=1 << 20)
    assert summary["checkpoints"] == [] and index.is_file()
    aside = [p for p in bank_dir(tmp_path).iterdir() if p.name.startswith("bank.db.not-a-file-")]
    assert len(aside) == 1 and (aside[0] / "inside").is_dir()  # moved, not deleted
    assert bank_clear(tmp_path) == {"dropped": 0, "bytes": 0}


def test_slot_files_no_index_holds_are_swept(tmp_path: Path) -> None:
    store = BankStore(tmp_path, budget_bytes=1 << 20)
    store.total_bytes()  # makes the folders and the index
    old, fresh = store.slots / "half-written-old.bin", store.slots / "being-written.bin"
    old.write_bytes(b"x" * 4096)
    fresh.write_bytes(b"x" * 10)
    long_ago = time.time() - STRAY_AGE_S - 5
    os.utime(old, (long_ago, long_ago))
    assert store.clear("some-model") == (1, 4096)  # one model's clear sweeps what no save still writes
    assert not old.exists() and fresh.exists()
    assert bank_clear(tmp_path)["dropped"] == 1 and not fresh.exists()  # the whole bank: every stray
