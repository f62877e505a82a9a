"""Admin API for eval suites: run one against a model, list past runs, read one run's cases.

A run sends each case through this same gateway as an ordinary chat request: the server connects to the
very socket the run was asked on, with the caller's own key, so the cases pass the same key, routing,
lane and limit checks as any client's request. Runs and cases land in <home>/evals.db (app/quality).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, NotFoundError
from app.quality.runner import http_ask, run_suite
from app.quality.store import CaseResult, EvalStore
from app.quality.suite import Suite, builtin_names, load_suite, suite_from_text
from app.server.admin.events import task_stream
from app.server.auth import caller_key
from app.server.gateway.request_input import path_text
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body

TAG = "Evals"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


class EvalRunNotFoundError(NotFoundError):
    code = "eval_run_not_found"


def _store(request: web.Request) -> EvalStore:
    return EvalStore(request.app[RUNTIME].paths.evals_db)


def own_base_url(request: web.Request) -> tuple[str, ssl.SSLContext | None]:
    """The /v1 base URL of the socket this request arrived on (this server), and how to speak TLS to it."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not sockname:
        raise BadRequestError("the request's connection is gone; run the suite again")
    host, port = sockname[0], sockname[1]
    host = f"[{host}]" if ":" in host else host
    if not request.secure:
        return f"http://{host}:{port}/v1", None
    # our own listener, reached at the address it accepted this request on: its certificate is ours
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return f"https://{host}:{port}/v1", context


async def requested_suite(request: web.Request, body: dict[str, Any], ref: str) -> Suite:
    """The suite a request names (`ref`, its `suite`): a built-in name or a file in the suites folder; or
    the text of a suite file sent whole (`suite_text`, with `suite` the file's name). No other file is
    read: a path elsewhere is refused unread, saying where suites go."""
    text = body.get("suite_text")
    if text is None:
        return await asyncio.to_thread(load_suite, ref, folder=request.app[RUNTIME].paths.suites)
    if not isinstance(text, str):
        raise BadRequestError("'suite_text' must be a suite file's text (a string)", param="suite_text")
    return await asyncio.to_thread(suite_from_text, text, name=ref)


def _min_score(body: dict[str, Any]) -> float | None:
    value = body.get("min_score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise BadRequestError("'min_score' must be a number from 0 to 1", param="min_score")
    return float(value)


@routes.get("/api/evals")
async def evals_list(request: web.Request) -> web.Response:
    """Past eval runs, newest first (`?model=` for one model's), and the built-in suite names"""
    model = request.query.get("model") or None
    runs = await asyncio.to_thread(_store(request).runs, model=model, limit=100)
    return web.json_response({"runs": [r.public() for r in runs], "suites": builtin_names()})


@routes.get("/api/evals/{run_id}")
async def evals_one(request: web.Request) -> web.Response:
    """One eval run with every case's score, reason and answer"""
    text = request.match_info["run_id"]
    if not (text.isascii() and text.isdigit() and len(text) <= 18):  # "²" is a digit to str.isdigit()
        raise EvalRunNotFoundError(f"no eval run {text!r}; `GET /api/evals` lists them", param="run_id")
    store = _store(request)
    record = await asyncio.to_thread(store.run, int(text))
    if record is None:
        raise EvalRunNotFoundError(f"no eval run {text}; `GET /api/evals` lists them", param="run_id")
    cases = await asyncio.to_thread(store.case_results, record.id)
    return web.json_response({**record.public(), "results": [c.public() for c in cases]})


@routes.post("/api/evals")
async def evals_run(request: web.Request) -> web.StreamResponse:
    """Run a suite against a model: `{"model", "suite": NAME, "min_score": null, "stream": false}`;
    `suite` is a built-in or a file in the suites folder, or the name of a suite sent as `suite_text`;
    with `stream` the cases arrive as `case` events and the outcome as `done`"""
    body = parse_body(await request.read())
    model, suite_ref = body.get("model"), body.get("suite")
    if not isinstance(model, str) or not model or not isinstance(suite_ref, str) or not suite_ref:
        raise BadRequestError(
            "send {'model': <a model id>, 'suite': <a built-in suite name or a file in the suites folder>}",
            param="model" if not isinstance(model, str) or not model else "suite",
        )
    path_text(body, "suite")
    threshold = _min_score(body)
    await request.app[RUNTIME].catalog.aget(model)  # an unknown model is a 404 now, not a run of failed cases
    suite = await requested_suite(request, body, suite_ref)
    base_url, context = own_base_url(request)
    key = caller_key(request)
    store = _store(request)

    if not body.get("stream"):
        async with aiohttp.ClientSession() as session:
            ask = http_ask(session, base_url, api_key=key, ssl_context=context)
            outcome = await run_suite(suite, model=model, ask=ask, store=store, threshold=threshold)
        return web.json_response(outcome.public())

    async def work(emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
        def on_case(index: int, total: int, result: CaseResult) -> None:
            emit("case", {"index": index, "total": total, **result.public()})

        async with aiohttp.ClientSession() as session:
            ask = http_ask(session, base_url, api_key=key, ssl_context=context)
            done = await run_suite(
                suite, model=model, ask=ask, store=store, threshold=threshold, on_case=on_case
            )
        return done.public()

    return await task_stream(request, work)
