"""Issue 31, defect 18: the Ollama API knows `BASE+ADAPTER` ids, as the OpenAI, Responses and Anthropic
APIs do (before: 404 "model not found")."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import ollama

from tests.conftest import link_models, running_server
from tests.support.fakehub import FakeHub
from tests.support.loragen import write_tiny_lora

PINNED = 'root ::= "the answer is 42"'


def test_ollama_chat_and_generate_take_a_base_plus_adapter_id(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    write_tiny_lora(models / "lora.gguf")
    home = tmp_path / "home"
    home.mkdir()
    lora = {"tiny": {"lora": [{"file": "lora.gguf", "scale": 1.0}]}}
    (home / "settings.json").write_text(json.dumps({"model_overrides": lora}))
    with running_server(home, models) as s:
        client = ollama.Client(host=s.url)
        said = client.generate(model="tiny+lora", prompt="hi", options={"num_predict": 4})
        assert said.done and said.model == "tiny+lora", said
        chat = client.chat(
            model="tiny+lora:latest", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}
        )
        assert chat.done, chat
        try:
            client.chat(model="tiny+nope", messages=[{"role": "user", "content": "hi"}])
        except ollama.ResponseError as exc:
            assert exc.status_code == 404
        else:
            raise AssertionError("an adapter the base does not load is not a model")


def test_an_alias_is_not_counted_as_a_model_without_a_lane(tmp_path: Path, model_store: Path) -> None:
    """Issue 31, defect 12 (the start-up log): an Ollama alias (copy, create, pull) is another name for a
    model, not one "in formats no lane runs yet"."""
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    home = tmp_path / "home"
    with running_server(home, models) as s:
        ollama.Client(host=s.url).copy("tiny", "tiny-copy")
    with running_server(home, models) as s:
        deadline = time.monotonic() + 10  # the log is read from stderr by a thread of its own
        while "models: " not in s.stderr_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = s.stderr_text()
    assert "models: 1 servable, 0 broken, 0 in formats no lane runs yet (1 alias(es))" in log, log


def test_a_completed_pull_through_ollama_shows_100_percent(
    fake_hub: FakeHub, tmp_path: Path, model_store: Path
) -> None:
    """Issue 31, defect 12 (jobs): a completed pull shows its download whole (before: 0 % or 22 %)."""
    fake_hub.add_repo(
        "org/pulled-GGUF", {"pulled-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()}, tags=["gguf"]
    )
    (tmp_path / "models").mkdir()
    with running_server(tmp_path / "home", tmp_path / "models") as s:
        for _ in ollama.Client(host=s.url).pull("hf.co/org/pulled-GGUF:Q8_0", stream=True):
            pass
        with urllib.request.urlopen(s.url + "/api/jobs", timeout=30) as r:
            jobs = json.loads(r.read())["jobs"]
    (pull,) = [j for j in jobs if j["kind"] == "download"]
    assert pull["state"] == "completed" and pull["progress"] == 1.0, pull
