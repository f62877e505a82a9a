"""OpenAI Responses API: POST /v1/responses, streaming or not, translated onto the lane's chat endpoint.

Errors before the answer starts are the usual OpenAI envelope; once a stream has begun, a failure is an
`error` event followed by `response.failed`. A stream whose model is still loading hears SSE comment lines
with the phase first; a start that fails ends it with `response.created`, `response.in_progress`, `error`
and `response.failed`. The request path itself is the runner's (app/server/gateway/runner.py); a remote model
(`NAME/MODEL`) goes the same way, its checks left to the remote.
"""

from __future__ import annotations

from aiohttp import web

from app.server.gateway.core import chat_has_images
from app.server.gateway.runner import Call, run
from app.server.surfaces.openai.validate import parse_body
from app.server.surfaces.responses.mcp_spec import split_tools
from app.server.surfaces.responses.tools import dropped_notice
from app.server.surfaces.responses.translate import ResponseTranslator, to_chat

routes = web.RouteTableDef()


@routes.post("/v1/responses")
async def create_response(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = parse_body(raw)
    other, mcp = split_tools(body.get("tools"))
    if mcp:  # MCP servers' tools: run here, over as many engine turns as the calls need (mcp_run.py)
        # imported here: the MCP SDK (and the tracing packages it loads) only once a request needs it
        from app.server.surfaces.responses.mcp_run import McpRun

        return await McpRun(request, body, entries=mcp, other_tools=other).respond()
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
    tr = ResponseTranslator(model=rc.model, echo=rc.echo, tools=rc.tools)
    return await run(request, call, tr)
