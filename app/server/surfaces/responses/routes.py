"""OpenAI Responses API: POST /v1/responses, streaming or not, translated onto the lane's chat endpoint.

Errors before the answer starts are the usual OpenAI envelope; once a stream has begun, a failure is an
`error` event followed by `response.failed`. A stream whose model is still loading hears SSE comment lines
with the phase first; a start that fails ends it with `response.created`, `response.in_progress`, `error`
and `response.failed`. The request path itself is the runner's (app/server/gateway/runner.py); a remote model
(`NAME/MODEL`) goes the same way, its checks left to the remote. Responses are kept for
`previous_response_id` and GET/DELETE /v1/responses/{id} unless `store` is false (stored.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from app.server.gateway.core import chat_has_images
from app.server.gateway.runner import Call, run
from app.server.keys import RUNTIME
from app.server.request_keys import CLIENT
from app.server.surfaces.openai.validate import bad as _bad
from app.server.surfaces.openai.validate import parse_body
from app.server.surfaces.responses.mcp_spec import split_tools
from app.server.surfaces.responses.stored import ResponseStore, as_items, without_mcp
from app.server.surfaces.responses.tools import dropped_notice
from app.server.surfaces.responses.translate import ResponseTranslator, to_chat

routes = web.RouteTableDef()
log = logging.getLogger("switchyard.responses")


def _store(request: web.Request) -> ResponseStore:
    return ResponseStore(request.app[RUNTIME].paths.home / "responses.db")


async def _continued(
    request: web.Request, body: dict[str, Any], *, has_mcp: bool
) -> tuple[dict[str, Any], dict[str, Any], Callable[[dict[str, Any]], None] | None]:
    """(the body with a stored conversation before its input, what the response echoes about it, the
    translator's `keep`: None where `store` is false)."""
    keep = body.get("store", True)
    if not isinstance(keep, bool):
        raise _bad("'store' must be true or false", "store")
    prev = body.get("previous_response_id")
    body = {k: v for k, v in body.items() if k not in ("previous_response_id", "store")}
    if prev is not None:
        if not isinstance(prev, str) or not prev:
            raise _bad("'previous_response_id' must be the id of a stored response", "previous_response_id")
        if body.get("input") is None:
            raise _bad("missing required field 'input' (the turn that follows the stored one)", "input")
        stored = await asyncio.to_thread(_store(request).get, prev, key_name=request.get(CLIENT))
        earlier = stored.conversation()
        body["input"] = [*(earlier if has_mcp else without_mcp(earlier)), *as_items(body["input"])]
    echo = {"store": keep, "previous_response_id": prev}
    if not keep or body.get("input") is None:
        return body, echo, None
    items, store, key_name = as_items(body["input"]), _store(request), request.get(CLIENT)

    def kept(response: dict[str, Any]) -> None:
        try:
            store.put(response, items=items, key_name=key_name)
        except Exception:  # the database locked or the disk full: the answer still goes out
            log.exception("could not store response %s", response.get("id"))

    return body, echo, kept


@routes.post("/v1/responses")
async def create_response(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = parse_body(raw)
    other, mcp = split_tools(body.get("tools"))
    body, stored_echo, keep = await _continued(request, body, has_mcp=bool(mcp))
    if mcp:  # MCP servers' tools: run here, over as many engine turns as the calls need (mcp_run.py)
        # imported here: the MCP SDK (and the tracing packages it loads) only once a request needs it
        from app.server.surfaces.responses.mcp_run import McpRun

        run_ = McpRun(request, body, entries=mcp, other_tools=other, echo=stored_echo, keep=keep)
        return await run_.respond()
    rc = to_chat(body)
    call = Call(
        model=rc.model,
        body=rc.chat,
        stream=rc.stream,
        size=len(raw),
        has_images=chat_has_images(rc.chat),
        param="input",
        headers=dropped_notice(rc.tools.dropped),
    )
    tr = ResponseTranslator(model=rc.model, echo={**rc.echo, **stored_echo}, tools=rc.tools, keep=keep)
    return await run(request, call, tr)


@routes.get("/v1/responses/{response_id}")
async def get_response(request: web.Request) -> web.Response:
    stored = await asyncio.to_thread(
        _store(request).get, request.match_info["response_id"], key_name=request.get(CLIENT)
    )
    return web.json_response(stored.response)


@routes.delete("/v1/responses/{response_id}")
async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    await asyncio.to_thread(_store(request).delete, rid, key_name=request.get(CLIENT))
    return web.json_response({"id": rid, "object": "response", "deleted": True})
