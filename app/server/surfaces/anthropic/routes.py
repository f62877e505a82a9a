"""Anthropic Messages API: POST /v1/messages (streaming or not) and /v1/messages/count_tokens.

Requests are translated to the lane's OpenAI chat endpoint (see translate_anthropic) and run by the one
request runner (gateway/runner.py); errors on these routes are Anthropic-shaped (the ANTHROPIC surface).
The key may come as `x-api-key` or `Authorization: Bearer` (auth.py checks it). A stream whose model is
still loading hears SSE comment lines with the phase; a start that fails ends it with an `error` event. A
named tool_choice is pinned the way llama.cpp enforces it (pin_named_tool_choice), and a prompt longer than
the lane's per-request context is a 400.

A remote model (`NAME/MODEL`) is translated the same way and sent to its remote with the remote's key; the
local-only checks (the vision projector, the prompt length) are left to the remote. count_tokens for it is
the `usage.prompt_tokens` of a one-token answer.
"""

from __future__ import annotations

from aiohttp import web

from app.server.gateway.runner import Call, run
from app.server.keys import GATEWAY
from app.server.request_keys import MODEL
from app.server.surfaces.anthropic.translate import MessagesCall, MessageTranslator, to_openai
from app.server.surfaces.openai.validate import parse_body
from app.server.surfaces.shapes import pin_named_tool_choice

routes = web.RouteTableDef()


def _parse(raw: bytes, *, for_count: bool) -> MessagesCall:
    call = to_openai(parse_body(raw), for_count=for_count)
    # llama.cpp would drop a named tool_choice object; offering only that tool, required, is the same
    # request in a form the engine enforces (and a choice naming an unknown tool is refused here)
    if (pinned := pin_named_tool_choice(call.openai)) is not None:
        call.openai.clear()
        call.openai.update(pinned)
    return call


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    call = _parse(raw, for_count=False)
    tr = MessageTranslator(
        model=call.model, stop_sequences=call.stop_sequences, single_tool_call=call.single_tool_call
    )
    run_call = Call(
        model=call.model, body=call.openai, stream=call.stream, size=len(raw), has_images=call.has_images
    )
    return await run(request, run_call, tr)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.StreamResponse:
    call = _parse(await request.read(), for_count=True)
    gw = request.app[GATEWAY]
    request[MODEL] = call.model
    to = await gw.resolve(call.model, "chat")
    request[MODEL] = to.model
    async with gw.hold(to) as target:
        await gw.check(target, call.openai, route="count_tokens", body_bytes=0, has_images=call.has_images)
        n = await gw.count_prompt(target, call.openai)
    return web.json_response({"input_tokens": n})
