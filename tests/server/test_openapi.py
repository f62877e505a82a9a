"""GET /openapi.json: a valid OpenAPI 3.1 document of every route, equal to docs/openapi.json, and
schemathesis against the OpenAI, Responses, Anthropic and Ollama routes of a real server with real lanes:
no 5xx, and every 4xx in the error shape of its surface."""

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
ANTHROPIC_PATHS = {"/v1/messages", "/v1/messages/count_tokens"}
OLLAMA_PATHS = {
    "/api/tags",
    "/api/ps",
    "/api/show",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
}
REGENERATE = ".venv/bin/python -m app.server.openapi_write"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("openapi")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    with running_server(base / "home", models, "--max-loaded", "2") as s:
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


def _shape_problem(path: str, status: int, body: Any) -> str | None:
    """None when `body` is right for an answer of `status` on `path`'s surface."""
    if status >= 500:
        return f"HTTP {status}: {body}"
    if status < 400:
        return None
    if path in ANTHROPIC_PATHS:
        err = body.get("error") if isinstance(body, dict) else None
        ok = body.get("type") == "error" and isinstance(err, dict) and {"type", "message"} <= set(err)
        return None if ok else f"HTTP {status} not Anthropic-shaped: {body}"
    if path in OLLAMA_PATHS:
        ok = isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]
        return None if ok else f"HTTP {status} not Ollama-shaped: {body}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not {"message", "type", "code"} <= set(err):
        return f"HTTP {status} without the error envelope: {body}"
    return None


def _bounded(path: str, body: dict[str, Any], model: str) -> None:
    """Aim a generated body at a real lane, with short answers (the suite must stay fast)."""
    body["model"] = model
    for name in ("max_tokens", "max_output_tokens"):
        if isinstance(body.get(name), int):
            body[name] = min(body[name], 16)
    if path == "/v1/responses" and "max_output_tokens" not in body:
        body["max_output_tokens"] = 16
    if path in OLLAMA_PATHS:
        body.pop("keep_alive", None)  # 0 or a short TTL would unload the lane: a reload per example
        options = body.setdefault("options", {})
        if isinstance(options, dict):
            n = options.get("num_predict")
            options["num_predict"] = min(n, 16) if isinstance(n, int) and not isinstance(n, bool) else 16


def _run_schemathesis(server: ServerProcess, paths: set[str], *, examples: int, models: list[str]) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    _, text = fetch(server)
    schema = schemathesis.openapi.from_dict(json.loads(text))
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path in paths]
    assert {op.path for op in ops} == paths
    problems: list[str] = []
    t0 = time.monotonic()
    for op in ops:
        cases = st.one_of(op.as_strategy(), op.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @settings(
            max_examples=examples,
            derandomize=True,  # the same cases every run: a finding is reproducible, never a flake
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases, model=st.sampled_from([None, *models]))
        def run(case: Any, model: str | None) -> None:
            if model is not None and isinstance(case.body, dict):
                _bounded(case.path, case.body, model)  # reach a real lane, not only model_not_found
            resp = case.call(base_url=server.url, timeout=60)
            try:
                body = resp.json()
            except ValueError:
                body = resp.text[:300]
            problem = _shape_problem(case.path, resp.status_code, body)
            if problem:
                problems.append(f"{case.method} {case.path} {case.body!r:.300}: {problem:.500}")

        run()
    assert problems == [], "\n".join(problems[:10])
    assert time.monotonic() - t0 < 40 * len(paths)


def test_schemathesis_openai_routes_never_5xx_and_always_envelope(server: ServerProcess) -> None:
    _run_schemathesis(server, OPENAI_PATHS, examples=30, models=["tiny", "embed"])


def test_schemathesis_responses_and_anthropic_routes(server: ServerProcess) -> None:
    _run_schemathesis(
        server, {"/v1/responses", *ANTHROPIC_PATHS}, examples=40, models=["tiny", "tiny", "embed"]
    )


def test_schemathesis_ollama_routes(server: ServerProcess) -> None:
    _run_schemathesis(server, OLLAMA_PATHS, examples=30, models=["tiny", "tiny:latest", "embed"])
