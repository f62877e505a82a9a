"""Issue 31, defects 1 and 10: embeddings of inputs longer than llama.cpp's default batch (512 tokens) on a
model with a 2048 context, on /v1/embeddings and /api/embed; and `dimensions` on /v1/embeddings."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server

LONG = "the quick brown fox jumps over the lazy dog " * 30  # over 512 tokens, under the 2048 context


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("embed")
    models = link_models(root / "models", model_store / "embed.gguf")
    with running_server(root / "home", models) as s:
        yield s


def test_an_input_over_512_tokens_is_embedded(server: ServerProcess) -> None:
    oa = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
    got = oa.embeddings.create(model="embed", input=LONG, encoding_format="float")
    assert got.usage.prompt_tokens > 512 and len(got.data[0].embedding) > 0, got.usage
    out = ollama.Client(host=server.url).embed(model="embed", input=LONG)
    assert len(out.embeddings) == 1 and len(out.embeddings[0]) == len(got.data[0].embedding)


def test_dimensions_cut_and_renormalise_on_v1_embeddings(server: ServerProcess) -> None:
    oa = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
    full = oa.embeddings.create(model="embed", input="hello", encoding_format="float").data[0].embedding
    cut = oa.embeddings.create(model="embed", input="hello", dimensions=8, encoding_format="float")
    vec = cut.data[0].embedding
    assert len(vec) == 8 < len(full)
    assert math.isclose(math.sqrt(sum(v * v for v in vec)), 1.0, rel_tol=1e-4)
    b64 = oa.embeddings.create(model="embed", input="hello", dimensions=8)  # the client's base64 default
    assert len(b64.data[0].embedding) == 8
    same = ollama.Client(host=server.url).embed(model="embed", input="hello", dimensions=8)
    assert [round(v, 4) for v in same.embeddings[0]] == [round(v, 4) for v in vec]
