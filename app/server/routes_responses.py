"""OpenAI Responses API: POST /v1/responses, streaming or not, translated onto the lane's chat endpoint.

Errors before the answer starts are the usual OpenAI envelope; once a stream has begun, a failure is an
`error` event followed by `response.failed`. A stream whose model is still loading hears SSE comment lines
with the phase first; a start that fails ends it with `response.created`, `response.in_progress`, `error`
and `response.failed`. The request path itself is the runner's (app/server/runner.py); a remote model
(`NAME/MODEL`) goes the same way, its checks left to the remote.
"""

from __future__ import annotations

from aiohttp import web

from app.server.gateway import chat_has_images
from app.server.runner import Call, run
from app.server.surface import OPENAI, serves
from app.server.translate_responses import ResponsesRun, ResponseTranslator, to_chat
from app.server.validate import parse_body

routes = web.RouteTableDef()


@routes.post("/v1/responses")
@serves(OPENAI)
async def create_response(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    rc = to_chat(parse_body(raw))
    call = Call(
        model=rc.model,
        body=rc.chat,
        stream=rc.stream,
        size=len(raw),
        has_images=chat_has_images(rc.chat),
        param="input",
    )
    return await run(request, OPENAI, call, ResponsesRun(ResponseTranslator(model=rc.model, echo=rc.echo)))
