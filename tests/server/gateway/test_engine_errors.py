"""Issue 31, defect 6: an answer llama.cpp's own output parser rejects (a JSON schema with free strings, on a
model that writes raw bytes) is a clear 502 from the engine, not a 500 `engine_http_500`, and a stream that
the engine ends with an error event still ends with `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, link_models, running_server

# `minProperties` is a keyword the gateway's own schema grammar does not write (schema_grammar.py), so this
# schema still reaches llama.cpp as a schema, through the chat parser that rejects what its grammar allowed
# (test_schema_answers.py: a schema the gateway writes never fails so)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
    "required": ["name", "city"],
    "minProperties": 2,
}
SEEDS = range(4)  # seeds 0-3 of the session's tiny model each write bytes the parser rejects


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("parse")
    models = link_models(root / "models", model_store / "tiny.gguf")
    with running_server(root / "home", models) as s:
        yield s


def body(seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "seed": seed,
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        **extra,
    }


def test_a_parse_failure_is_a_clear_engine_error(server: ServerProcess) -> None:
    refused = []
    for seed in SEEDS:
        r = httpx.post(server.api + "/chat/completions", json=body(seed), timeout=120)
        assert r.status_code in (200, 502), r.text  # never a 500
        if r.status_code == 502:
            refused.append(r.json()["error"])
    assert refused, "no seed met the parser failure: pick seeds that do"
    for err in refused:
        assert err["code"] == "engine_output_unparsed" and err["source"] == "engine", err
        assert "retry with another seed" in err["message"] and "peg-native" in err["message"], err


def test_a_stream_the_engine_ends_with_an_error_still_ends_with_done(server: ServerProcess) -> None:
    ended_in_error = 0
    for seed in SEEDS:
        with httpx.stream(
            "POST", server.api + "/chat/completions", json=body(seed, stream=True), timeout=120
        ) as r:
            events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]", events[-3:]
        if any("error" in json.loads(e[6:]) for e in events[:-1] if e.startswith("data: {")):
            ended_in_error += 1
    assert ended_in_error, "no seed met the parser failure: pick seeds that do"
