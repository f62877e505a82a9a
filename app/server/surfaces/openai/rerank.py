"""Rerank routes (`/v1/rerank`, `/rerank`, `/v2/rerank`) in the Jina / Cohere shape, answered by a reranker
model's lane (llama.cpp in rank-pooling mode).

The body is checked here, so a bad one is a 400 naming the field before any lane starts; the engine gets
the documents as plain strings. Its answer is reshaped into the documented one: sorted by relevance,
`top_n` applied, each document's text added when `return_documents` asks for it, `model` as requested.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError, UpstreamRefusedError
from app.server.gateway.lane_call import call_lane, need_model
from app.server.metrics import USAGE
from app.server.surfaces.openai.validate import parse_body

routes = web.RouteTableDef()
ENGINE_PATH = "/v1/rerank"  # llama.cpp's route (it serves /rerank and /reranking as well)


def _query(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequestError(
            "field 'query' must be a non-empty string: the text the documents are ranked against",
            param="query",
        )
    return value


def _documents(value: Any) -> list[str]:
    """The documents' texts; each may be a string or an object with a string `text` (Cohere v2, Jina)."""
    if not isinstance(value, list) or not value:
        raise BadRequestError(
            "field 'documents' must be a non-empty list of strings (or of {\"text\": ...} objects)",
            param="documents",
        )
    texts: list[str] = []
    for i, doc in enumerate(value):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise BadRequestError(
                f"documents[{i}] must be a string or an object with a string 'text', not {json.dumps(doc)}",
                param="documents",
            )
        texts.append(text)
    return texts


def _top_n(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequestError(
            f"field 'top_n' must be a positive integer (how many results to return), not {json.dumps(value)}",
            param="top_n",
        )
    return value


def _return_documents(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequestError("field 'return_documents' must be true or false", param="return_documents")
    return value


def _score(row: dict[str, Any]) -> float:
    value = row.get("relevance_score")
    return float(value) if isinstance(value, int | float) else 0.0


def reshape(
    data: dict[str, Any], *, model: str, texts: list[str], top_n: int | None, return_documents: bool
) -> dict[str, Any]:
    """The engine's rerank answer in the documented shape (llama.cpp's lacks `document`; an engine may
    ignore `top_n` or leave results unsorted)."""
    rows = [
        r
        for r in data.get("results") or []
        if isinstance(r, dict) and isinstance(r.get("index"), int) and 0 <= r["index"] < len(texts)
    ]
    rows.sort(key=_score, reverse=True)
    results: list[dict[str, Any]] = []
    for r in rows[:top_n] if top_n is not None else rows:
        item: dict[str, Any] = {"index": r["index"], "relevance_score": _score(r)}
        if return_documents:
            item["document"] = {"text": texts[r["index"]]}
        results.append(item)
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    prompt = usage.get("prompt_tokens", 0)
    return {
        "model": model,
        "object": "list",
        "results": results,
        "usage": {"prompt_tokens": prompt, "total_tokens": usage.get("total_tokens", prompt)},
    }


def _engine_json(answer: web.Response, model: str) -> dict[str, Any]:
    raw = answer.body if isinstance(answer.body, bytes | bytearray) else b""  # call_lane answers bytes
    try:
        data = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise UpstreamRefusedError(
            f"the engine of {model!r} answered /v1/rerank with something that is not JSON; "
            f"see its log at GET /api/lanes/{model}/logs",
            status=502,
            source="engine",
            code="engine_bad_answer",
        ) from exc
    if not isinstance(data, dict):
        raise UpstreamRefusedError(
            f"the engine of {model!r} answered /v1/rerank with JSON that is not an object",
            status=502,
            source="engine",
            code="engine_bad_answer",
        )
    return data


@routes.post("/v1/rerank")
@routes.post("/rerank")
@routes.post("/v2/rerank")
async def rerank(request: web.Request) -> web.Response:
    """Rank documents by relevance to a query on a reranker model (Jina / Cohere shape)

    `documents` are strings or `{"text": ...}` objects; results come sorted by `relevance_score`, at most
    `top_n` of them, each with its `document` when `return_documents` is true. /rerank and /v2/rerank are
    the same route."""
    body = parse_body(await request.read())
    model = need_model(body.get("model"))
    query = _query(body.get("query"))
    texts = _documents(body.get("documents"))
    top_n = _top_n(body.get("top_n"))
    return_documents = _return_documents(body.get("return_documents"))
    upstream: dict[str, Any] = {"model": model, "query": query, "documents": texts}
    if top_n is not None:
        upstream["top_n"] = top_n
    answer = await call_lane(
        request,
        model=model,
        capability="rerank",
        path=ENGINE_PATH,
        body=json.dumps(upstream).encode(),
        content_type="application/json",
    )
    if answer.status != 200:
        return answer  # the engine's (or remote's) own error, passed through
    data = _engine_json(answer, model)
    out = reshape(data, model=model, texts=texts, top_n=top_n, return_documents=return_documents)
    if isinstance(prompt := out["usage"]["prompt_tokens"], int):
        request[USAGE] = (prompt, 0)  # for /metrics: a reranker reads tokens, it writes none
    return web.json_response(out)
