"""GET /openapi.json: a valid OpenAPI 3.1 document of every route, equal to docs/openapi.json, and
schemathesis against the OpenAI routes of a real server with a real lane (no 5xx, every 4xx enveloped)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app
from app.server.openapi import DOC_PATH, document
from tests.conftest import ServerProcess, link_models, running_server

OPENAI_PATHS = {
    "/v1/models",
    "/v1/models/{model_id}",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
}
REGENERATE = ".venv/bin/python -m app.server.openapi"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("openapi")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    with running_server(base / "home", models) as s:
        yield s


def fetch(server: ServerProcess) -> tuple[str, str]:
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=30) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_document_is_valid_openapi_3_1(server: ServerProcess) -> None:
    ctype, text = fetch(server)
    assert ctype.startswith("application/json")
    doc = json.loads(text)
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "Switchyard"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and op["responses"]["default"], (method, path)
            refs = json.dumps(op)
            for name in set(part.split('"')[0] for part in refs.split("#/components/schemas/")[1:]):
                assert name in doc["components"]["schemas"], name
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)


def test_every_route_is_listed_with_its_summary(tmp_path: Path) -> None:
    app = make_app(Runtime(settings=Settings(), paths=Paths(home=tmp_path / "home")))
    doc = document(app)
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method not in ("HEAD", "*")
    }
    listed = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == served
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ChatCompletionRequest"
    )
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert chat["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert doc["paths"]["/api/chat"]["post"]["responses"]["default"]["content"]["application/json"]["schema"][
        "$ref"
    ].endswith("/OllamaError")
    events = doc["paths"]["/api/events"]["get"]
    assert events["summary"].startswith("Server-sent events")  # from the handler's docstring
    assert {p["name"] for p in doc["paths"]["/api/models/{model_id}/load"]["post"]["parameters"]} == {
        "model_id"
    }


def test_committed_copy_is_what_the_server_serves(server: ServerProcess) -> None:
    _, text = fetch(server)
    committed = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert committed == text, f"docs/openapi.json is stale: regenerate it with `{REGENERATE}`"


def _envelope_problem(status: int, body: Any) -> str | None:
    if status >= 500:
        return f"HTTP {status}: {body}"
    if 400 <= status < 500:
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict) or not {"message", "type", "code"} <= set(err):
            return f"HTTP {status} without the error envelope: {body}"
    return None


def test_schemathesis_openai_routes_never_5xx_and_always_envelope(server: ServerProcess) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    _, text = fetch(server)
    schema = schemathesis.openapi.from_dict(json.loads(text))
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path in OPENAI_PATHS]
    assert {op.path for op in ops} == OPENAI_PATHS
    problems: list[str] = []
    t0 = time.monotonic()
    for op in ops:
        cases = st.one_of(op.as_strategy(), op.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @settings(
            max_examples=30,
            derandomize=True,  # the same cases every run: a finding is reproducible, never a flake
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases, model=st.sampled_from([None, "tiny", "embed"]))
        def run(case: Any, model: str | None) -> None:
            if model is not None and isinstance(case.body, dict):
                case.body["model"] = model  # reach a real lane, not only model_not_found
                if isinstance(case.body.get("max_tokens"), int):
                    case.body["max_tokens"] = min(case.body["max_tokens"], 16)
            resp = case.call(base_url=server.url, timeout=60)
            try:
                body = resp.json()
            except ValueError:
                body = resp.text[:300]
            problem = _envelope_problem(resp.status_code, body)
            if problem:
                problems.append(f"{case.method} {case.path} {case.body!r:.300}: {problem:.500}")

        run()
    assert problems == [], "\n".join(problems[:10])
    assert time.monotonic() - t0 < 120
