"""Rerankers end to end: a tiny qwen3 reranker GGUF (rank pooling) served by a real `switchyard serve` on
llama.cpp beside the tiny chat and embedding models; the Jina / Cohere shape on all three paths, the 400s,
and the reranker as a side lane that leaves the chat lane loaded."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.lanes.engines.llamacpp.kind import LlamaCppKind, llama_server_argv, plan_params
from app.library.catalog import Catalog
from tests.conftest import REPO, ServerProcess, link_models, running_server
from tests.support.tinymodels import write_tiny_reranker

DOCS = ["the answer is 42", "a cat sat on the mat", "tea", "the answer"]
PATHS = ["/v1/rerank", "/rerank", "/v2/rerank"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    d = link_models(tmp_path_factory.mktemp("rerank") / "models", model_store / "tiny.gguf")
    link_models(d, model_store / "embed.gguf")
    write_tiny_reranker(d / "rerank.gguf")
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Iterator[ServerProcess]:
    # one chat lane and one side lane: the reranker must take the side slot, not the chat one
    with running_server(tmp_path_factory.mktemp("rerank-home"), models, "--max-loaded", "1") as s:
        yield s


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def rerank(server: ServerProcess, path: str = "/v1/rerank", **fields: Any) -> dict[str, Any]:
    r = post(server, path, {"model": "rerank", "query": "what is the answer?", "documents": DOCS, **fields})
    assert r.status_code == 200, r.text
    return dict(r.json())


# ---- the model, the catalog and the lane's command --------------------------------------------------
def test_reranker_is_kind_rerank_and_starts_in_reranking_mode(models: Path) -> None:
    catalog = Catalog([models])
    catalog.scan()
    entry = catalog.get("rerank")
    assert entry.facts is not None and entry.facts.pooling_type == "rank"
    assert entry.kind == "rerank" and catalog.get("embed").kind == "embedding"
    assert LlamaCppKind().capabilities(entry) == {"rerank"}
    params = plan_params(entry, Settings())
    assert params.embedding and params.pooling == "rank"  # the worker's CommonParams: pooling RANK
    argv = llama_server_argv("/opt/llama-server", params, port=1, ppid=1)
    assert "--reranking" in argv and "--pooling" not in argv
    embed = plan_params(catalog.get("embed"), Settings())
    assert "--reranking" not in llama_server_argv("/opt/llama-server", embed, port=1, ppid=1)


def test_ls_and_models_list_say_rerank(server: ServerProcess, models: Path, tmp_path: Path) -> None:
    env = dict(os.environ, SWITCHYARD_HOME=str(tmp_path / "home"))
    out = subprocess.run(
        [sys.executable, "-m", "app", "ls", "--json", "--models-dir", str(models)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    listed = {m["id"]: m["kind"] for m in json.loads(out.stdout)["models"]}
    assert listed == {"tiny": "chat", "embed": "embedding", "rerank": "rerank"}
    kinds = {m["id"]: m["kind"] for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert kinds == {"tiny": "chat", "embed": "embedding", "rerank": "rerank"}
    assert httpx.get(server.url + "/v1/models/rerank").json()["kind"] == "rerank"


# ---- the route --------------------------------------------------------------------------------------
def test_results_are_sorted_and_cover_every_document(server: ServerProcess) -> None:
    data = rerank(server)
    assert data["model"] == "rerank" and data["object"] == "list"
    results = data["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) > 1  # the head really scored each pair, not a constant
    assert all("document" not in r for r in results)  # return_documents defaults to false
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] >= usage["prompt_tokens"]


def test_top_n_keeps_the_best_and_return_documents_adds_their_text(server: ServerProcess) -> None:
    full = [r["index"] for r in rerank(server)["results"]]
    best = rerank(server, top_n=2, return_documents=True)["results"]
    assert [r["index"] for r in best] == full[:2]
    assert [r["document"]["text"] for r in best] == [DOCS[i] for i in full[:2]]
    assert len(rerank(server, top_n=10)["results"]) == len(DOCS)  # more than there are: all of them


def test_text_objects_rank_like_strings(server: ServerProcess) -> None:
    plain = rerank(server)["results"]
    r = post(
        server,
        "/v1/rerank",
        {"model": "rerank", "query": "what is the answer?", "documents": [{"text": d} for d in DOCS]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["results"] == plain


@pytest.mark.parametrize("path", PATHS)
def test_every_path_answers_the_same(server: ServerProcess, path: str) -> None:
    assert rerank(server, path, top_n=3)["results"] == rerank(server, top_n=3)["results"]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"query": None}, "query"),
        ({"query": 5}, "query"),
        ({"query": "  "}, "query"),
        ({"documents": []}, "documents"),
        ({"documents": "one document"}, "documents"),
        ({"documents": ["ok", 3]}, "documents"),
        ({"documents": [{"text": ["x"]}]}, "documents"),
        ({"top_n": 0}, "top_n"),
        ({"top_n": "2"}, "top_n"),
        ({"top_n": True}, "top_n"),
        ({"return_documents": "yes"}, "return_documents"),
        ({"model": None}, "model"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(
    server: ServerProcess, change: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "rerank", "query": "q", "documents": ["a", "b"]}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    r = post(server, "/v1/rerank", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


@pytest.mark.parametrize("model", ["tiny", "embed"])
def test_a_model_that_is_not_a_reranker_is_told_so(server: ServerProcess, model: str) -> None:
    r = post(server, "/v1/rerank", {"model": model, "query": "q", "documents": ["a"]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "capability_missing" and err["param"] == "model"
    assert f"model {model!r} is not a reranker" in err["message"]
    assert err["message"].endswith("models that can: rerank")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/v1/embeddings", {"input": "hi"}),
    ],
)
def test_a_reranker_asked_for_chat_or_embeddings_is_told_to_rerank(
    server: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    r = post(server, path, {"model": "rerank", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "capability_missing"
    assert "'rerank' is a reranker" in err["message"] and "/v1/rerank" in err["message"]


def test_the_chat_lane_stays_loaded_while_the_reranker_loads(server: ServerProcess) -> None:
    httpx.post(server.url + "/api/models/rerank/unload", timeout=30)
    chat = post(
        server,
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert chat.status_code == 200, chat.text
    rerank(server)
    states = {ln["id"]: ln["state"] for ln in httpx.get(server.url + "/api/lanes").json()["lanes"]}
    assert states["tiny"] == "ready" and states["rerank"] == "ready"
    # the embedding model shares the side slot with the reranker: loading it swaps the reranker out
    assert post(server, "/v1/embeddings", {"model": "embed", "input": "hi"}).status_code == 200
    states = {ln["id"]: ln["state"] for ln in httpx.get(server.url + "/api/lanes").json()["lanes"]}
    assert states["tiny"] == "ready" and states["embed"] == "ready" and states["rerank"] == "stopped"
