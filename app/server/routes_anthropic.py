"""Anthropic Messages API: POST /v1/messages (streaming or not) and /v1/messages/count_tokens.

Requests are translated to the lane's OpenAI chat endpoint (see translate_anthropic); errors on these
routes are Anthropic-shaped. The key may come as `x-api-key` or `Authorization: Bearer` (auth.py checks
it). A stream whose model is still loading hears SSE comment lines with the phase; a start that fails
ends it with an `error` event. A named tool_choice is pinned the way llama.cpp enforces it
(pin_named_tool_choice), and a prompt longer than the lane's per-request context is a 400.

A remote model (`NAME/MODEL`) is translated the same way and sent to its remote with the remote's key; the
local-only checks (the vision projector, the prompt length) are left to the remote, whose refusals come
back in Anthropic's error shape. count_tokens for it is the `usage.prompt_tokens` of a one-token answer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, SwitchyardError
from app.lanes.lane import Lane
from app.lanes.remote import RemoteLane
from app.runtime import Runtime
from app.server.keys import RUNTIME
from app.server.limits import check_prompt
from app.server.metrics import USAGE
from app.server.proxy import needs_loading, sse_response, wait_loading
from app.server.remote_proxy import Held, hold, remote_for
from app.server.request_keys import MODEL
from app.server.translate_anthropic import MessagesCall, MessageTranslator, error_body, sse, to_openai
from app.server.translate_engine import (
    has_vision,
    pin_named_tool_choice,
    post,
    prompt_tokens,
    sse_chunks,
)
from app.server.validate import parse_body

log = logging.getLogger("switchyard.anthropic")
routes = web.RouteTableDef()
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: SwitchyardError) -> web.Response:
    return web.json_response(error_body(exc), status=exc.status)


async def _guarded(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SwitchyardError as exc:
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge:
        return error_response(BadRequestError("the request body is too large"))
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("unhandled error on %s %s", request.method, request.path)
        err = SwitchyardError(f"internal gateway error: {type(exc).__name__}: {exc}")
        return error_response(err)


def _error_event(exc: SwitchyardError) -> bytes:
    return sse([("error", error_body(exc))])


async def _parse(request: web.Request, *, for_count: bool) -> tuple[Runtime, MessagesCall, RemoteLane | None]:
    """The call, and the remote lane when its model is a remote's (None: a local model)."""
    call = to_openai(parse_body(await request.read()), for_count=for_count)
    request[MODEL] = call.model
    pin_named_tool_choice(call.openai)  # a tool_choice naming an unknown tool is refused before a start
    rt = request.app[RUNTIME]
    if (remote := remote_for(request, call.model)) is not None:
        if (missing := remote.capability_error("chat")) is not None:
            raise missing
        return rt, call, remote
    if rt.catalog.get(call.model).kind != "chat":
        raise BadRequestError(
            f"model {call.model!r} is an embedding model; the Messages API needs a chat model "
            "(embeddings: POST /v1/embeddings)",
            param="model",
        )
    return rt, call, None


async def _check_images(held: Held, call: MessagesCall) -> None:
    """A local engine without a vision projector cannot read images; a remote answers for itself."""
    lane = held.lane
    if call.has_images and isinstance(lane, Lane) and not await has_vision(held.http, lane):
        raise BadRequestError(
            f"model {call.model!r} cannot read images: its engine has no vision projector (mmproj) "
            "loaded, and Switchyard does not load projectors yet; send text blocks only",
            param="messages",
        )


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    return await _guarded(request, _messages)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.StreamResponse:
    return await _guarded(request, _count_tokens)


async def _count_tokens(request: web.Request) -> web.StreamResponse:
    _, call, remote = await _parse(request, for_count=True)
    async with hold(request, call.model, remote=remote) as held:
        await _check_images(held, call)
        n = await prompt_tokens(held.http, held.lane, call.openai)
    return web.json_response({"input_tokens": n})


async def _messages(request: web.Request) -> web.StreamResponse:
    rt, call, remote = await _parse(request, for_count=False)
    resp: web.StreamResponse | None = None
    if call.stream and remote is None and needs_loading(rt.supervisor, call.model):
        resp = sse_response()
        if not await wait_loading(request, rt.supervisor, call.model, resp=resp, fail=_error_event):
            return resp
    try:
        return await _answer(request, rt, call, resp, remote=remote)
    except SwitchyardError as exc:
        if resp is None:
            raise
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await resp.write(_error_event(exc))  # the stream said 200 already: the error is an event
        return resp


async def _answer(
    request: web.Request,
    rt: Runtime,
    call: MessagesCall,
    resp: web.StreamResponse | None,
    *,
    remote: RemoteLane | None,
) -> web.StreamResponse:
    async with hold(request, call.model, remote=remote) as held:
        lane, http = held.lane, held.http
        await _check_images(held, call)
        if rt.settings.check_prompt_length and isinstance(lane, Lane):  # a remote enforces its own
            size = len(await request.read())  # aiohttp keeps the body: no second read
            await check_prompt(http, lane, call.openai, body_bytes=size, route="chat")
        # llama.cpp would drop the named tool_choice object; offering only that tool, required, is
        # the same request in a form the engine enforces
        body = pin_named_tool_choice(call.openai) or call.openai
        upstream = await post(http, lane, "/v1/chat/completions", body)
        tr = MessageTranslator(model=call.model, stop_sequences=call.stop_sequences)
        try:
            if call.stream:
                return await _stream(request, held, upstream, tr, call, resp)
            async with contextlib.aclosing(sse_chunks(upstream, lane)) as chunks:
                async for chunk in chunks:
                    tr.feed(chunk)
                    if tr.stopped:
                        break
            upstream.close()
            await _settle_usage(held, tr, call)
            tr.finish()
            request[USAGE] = _usage(tr)
            return web.json_response(tr.message())
        finally:
            upstream.close()  # closing (not releasing) drops the socket: the engine stops work for us


def _usage(tr: MessageTranslator) -> tuple[int, int]:
    """(input, output) tokens for /metrics."""
    usage = tr.usage()
    return usage["input_tokens"], usage["output_tokens"]


async def _settle_usage(held: Held, tr: MessageTranslator, call: MessagesCall) -> None:
    """A stop sequence cut the engine off before its usage report: count the prompt ourselves."""
    if tr.input_tokens is None:
        try:
            tr.input_tokens = await prompt_tokens(held.http, held.lane, call.openai)
        except SwitchyardError as exc:
            log.info("could not count prompt tokens for %s: %s", call.model, exc.message)


async def _stream(
    request: web.Request,
    held: Held,
    upstream: aiohttp.ClientResponse,
    tr: MessageTranslator,
    call: MessagesCall,
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    if resp is None:
        resp = sse_response()
        await resp.prepare(request)
    try:
        await resp.write(sse(tr.start()))
        try:
            async with contextlib.aclosing(sse_chunks(upstream, held.lane)) as chunks:
                async for chunk in chunks:
                    events = tr.feed(chunk)
                    if events:
                        await resp.write(sse(events))
                    if tr.stopped:
                        break
            upstream.close()
            await _settle_usage(held, tr, call)
            await resp.write(sse(tr.finish()))
            request[USAGE] = _usage(tr)
        except SwitchyardError as exc:  # mid-stream: the status is sent already, so say it as an event
            await resp.write(sse([("error", error_body(exc))]))
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client went away mid-stream; closing the upstream request")
    return resp
