"""The MLX lane for real: `mlx_lm.server` (the CPU build of mlx on Linux) on a generated Hugging Face llama
folder, through a real `switchyard serve`, with the official openai client."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server
from tests.support.mlxgen import write_mlx_llama

pytest.importorskip("mlx_lm")
pytest.importorskip("tokenizers")

MODEL = "tiny-mlx"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("mlx")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_mlx_llama(models / MODEL)
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def test_chat_stream_and_completion_on_mlx(client: openai.OpenAI, server: ServerProcess) -> None:
    listed = {m.id: m.model_extra for m in client.models.list()}
    assert listed[MODEL]["kind"] == "chat"
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "w3 w4"}], max_tokens=4
    )
    assert r.choices[0].message.content is not None and r.usage is not None
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "w5"}], max_tokens=3, stream=True
        )
    )
    assert len(chunks) >= 3 and any(c.choices and c.choices[0].delta.content for c in chunks)
    c = client.completions.create(model=MODEL, prompt="w7 w8", max_tokens=2)
    assert c.choices and isinstance(c.choices[0].text, str)
    assert r.model == MODEL and c.model == MODEL  # the engine knows the model by our id
    lanes = {
        ln["model"]: ln
        for ln in json.loads(urllib.request.urlopen(server.url + "/api/lanes").read())["lanes"]
    }
    lane = lanes[MODEL]
    assert lane["engine"] == "mlx" and lane["runtime"] == "mlx-lm" and lane["state"] == "ready"
    # runtime-managed: no made-up prediction; the trained window as the ceiling; memory as measured
    assert lane["predicted"] is None and lane["params"]["trained_context"] == 8192
    assert lane["measured"]["rss_bytes"] > 10 << 20


def test_mlx_model_from_the_ollama_and_anthropic_surfaces(server: ServerProcess) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w3"}],
        "stream": False,
        "options": {"num_predict": 2},
    }
    req = urllib.request.Request(
        server.url + "/api/chat", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        got = json.loads(r.read())
    assert got["done"] is True and isinstance(got["message"]["content"], str)
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "w4"}]}
    req = urllib.request.Request(
        server.url + "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        msg = json.loads(r.read())
    assert msg["type"] == "message" and msg["content"][0]["type"] == "text"


def test_mlx_lane_refuses_what_it_cannot_do(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=MODEL, input="x")
    assert "cannot do embeddings" in str(exc.value) and "MLX" in str(exc.value)
