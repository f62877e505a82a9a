"""OpenAI Responses API: POST /v1/responses, streaming or not, translated onto the lane's chat endpoint.

Errors before the answer starts are the usual OpenAI envelope (raised to the errors middleware);
once a stream has begun, a failure is an `error` event followed by `response.failed`. A stream whose
model is still loading hears SSE comment lines with the phase first; a start that fails ends it with
`response.created`, `response.in_progress`, `error` and `response.failed`.

A remote model (`NAME/MODEL`) is translated the same way and sent to its remote with the remote's key; the
prompt-length check (llama.cpp's tokenizer) is left to the remote, whose refusals come back as the usual
envelope with `source: remote`.
"""

from __future__ import annotations

import contextlib
import logging
import time

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, SwitchyardError
from app.lanes.lane import Lane
from app.lanes.remote import AnyLane, RemoteLane
from app.runtime import Runtime
from app.server.keys import RUNTIME
from app.server.limits import check_prompt
from app.server.metrics import FIRST_BYTE, USAGE
from app.server.proxy import needs_loading, sse_response, wait_loading
from app.server.remote_proxy import hold, remote_for
from app.server.request_keys import MODEL
from app.server.translate_engine import post, sse_chunks
from app.server.translate_responses import ResponsesCall, ResponseTranslator, sse, to_chat
from app.server.validate import parse_body

log = logging.getLogger("switchyard.responses")
routes = web.RouteTableDef()


@routes.post("/v1/responses")
async def create_response(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    call = to_chat(parse_body(raw))
    request[MODEL] = call.model
    rt = request.app[RUNTIME]
    if (remote := remote_for(request, call.model)) is not None:
        if (missing := remote.capability_error("chat")) is not None:
            raise missing
    elif rt.catalog.get(call.model).kind != "chat":
        raise BadRequestError(
            f"model {call.model!r} is an embedding model; the Responses API needs a chat model "
            "(embeddings: POST /v1/embeddings)",
            param="model",
        )
    resp: web.StreamResponse | None = None
    if call.stream and remote is None and needs_loading(rt.supervisor, call.model):
        resp = sse_response()
        tr = ResponseTranslator(model=call.model, echo=call.echo)

        def fail(exc: SwitchyardError) -> bytes:
            return sse([*tr.start(), *tr.fail(exc)])

        if not await wait_loading(request, rt.supervisor, call.model, resp=resp, fail=fail):
            return resp
    try:
        return await _answer(request, rt, call, resp, size=len(raw), remote=remote)
    except SwitchyardError as exc:
        if resp is None:
            raise
        tr = ResponseTranslator(model=call.model, echo=call.echo)
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await resp.write(sse([*tr.start(), *tr.fail(exc)]))  # the stream said 200 already
        return resp


async def _answer(
    request: web.Request,
    rt: Runtime,
    call: ResponsesCall,
    resp: web.StreamResponse | None,
    *,
    size: int,
    remote: RemoteLane | None,
) -> web.StreamResponse:
    async with hold(request, call.model, remote=remote) as held:
        lane = held.lane
        if rt.settings.check_prompt_length and isinstance(lane, Lane):  # a remote enforces its own
            try:
                await check_prompt(held.http, lane, call.chat, body_bytes=size, route="chat")
            except SwitchyardError as exc:
                exc.param = "input"  # the prompt is built from instructions and input here
                raise
        upstream = await post(held.http, lane, "/v1/chat/completions", call.chat)
        tr = ResponseTranslator(model=call.model, echo=call.echo)
        try:
            if call.stream:
                return await _stream(request, lane, upstream, tr, resp)
            async with contextlib.aclosing(sse_chunks(upstream, lane)) as chunks:
                async for chunk in chunks:
                    tr.feed(chunk)
            tr.finish()
            request[USAGE] = _usage(tr)
            return web.json_response(tr.response())
        finally:
            upstream.close()  # closing (not releasing) drops the socket: the engine stops work for us


async def _stream(
    request: web.Request,
    lane: AnyLane,
    upstream: aiohttp.ClientResponse,
    tr: ResponseTranslator,
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    if resp is None:
        resp = sse_response()
        await resp.prepare(request)
    try:
        await resp.write(sse(tr.start()))
        try:
            async with contextlib.aclosing(sse_chunks(upstream, lane)) as chunks:
                async for chunk in chunks:
                    events = tr.feed(chunk)
                    if events:
                        await resp.write(sse(events))
                        if FIRST_BYTE not in request:
                            request[FIRST_BYTE] = time.perf_counter()
            await resp.write(sse(tr.finish()))
            request[USAGE] = _usage(tr)
        except SwitchyardError as exc:  # mid-stream: the status is sent already, so say it as events
            await resp.write(sse(tr.fail(exc)))
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client went away mid-stream; closing the upstream request")
    return resp


def _usage(tr: ResponseTranslator) -> tuple[int, int]:
    """(input, output) tokens for the metrics."""
    usage = tr.usage()
    return int(usage["input_tokens"]), int(usage["output_tokens"])
