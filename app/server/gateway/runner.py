"""The one runner of a translated route (Anthropic Messages, Responses, Ollama chat/generate):
parse → resolve → wait → hold → check → post → stream or collect → error in the stream.

A route parses its body into a `Call` (the OpenAI chat body the engine gets) and a `Translator` (the
engine's deltas as its surface's pieces, framed here by the surface's encoding); everything else is here,
once. The engine is always asked to stream:
a whole answer is collected from the same deltas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from app.chat.deltas import Delta
from app.core.errors import SwitchyardError
from app.lanes.lane_requests import speaks_llama_server
from app.lanes.target import Target
from app.server.gateway.core import Gateway
from app.server.gateway.forced_call import forced_call_body, needs_forced_call
from app.server.gateway.images import check_request_images
from app.server.gateway.output_clamp import clamp_to_slot
from app.server.gateway.raw_tools import raw_tool_deltas, takes_raw_path
from app.server.gateway.relay import translate_raw
from app.server.gateway.response_notes import note
from app.server.gateway.safety_gate import GATE, answers_judged, check_request, gate_for, judging
from app.server.gateway.tool_notice import notices
from app.server.gateway.tool_recovery import RecoveringRun
from app.server.gateway.waiting import wait_in_stream
from app.server.keys import GATEWAY
from app.server.metrics import FIRST_BYTE, USAGE
from app.server.request_keys import MODEL
from app.server.surfaces.base import Encoding, surface_of
from app.server.surfaces.translation import TranslatedRun, Translation, Translator

log = logging.getLogger("switchyard.runner")
_RESETS = (ConnectionResetError, aiohttp.ClientConnectionResetError)


@dataclass(frozen=True)
class Call:
    model: str
    body: dict[str, Any]  # the OpenAI body the engine gets (always streamed)
    stream: bool  # whether the client gets a stream
    size: int  # the client's body in bytes (the prompt-length check's bound)
    path: str = "/v1/chat/completions"
    capability: str = "chat"
    has_images: bool = False
    param: str | None = None  # the client's field a too-long prompt or an image is blamed on
    headers: dict[str, str] = field(default_factory=dict)


async def run(request: web.Request, call: Call, translator: Translator) -> web.StreamResponse:
    """Run `call` for the surface of the route `request` matched, its answer in `translator`'s pieces framed
    by that surface's encoding."""
    surface = surface_of(request)
    if surface is None:
        raise TypeError(f"{request.path} is no surface's route: install it through SURFACES to run it here")
    encoding = surface.encoding
    gw = request.app[GATEWAY]
    request[MODEL] = call.model
    # tool calls an engine reported but did not send
    recovering = RecoveringRun(TranslatedRun(translator, encoding=encoding), model=call.model)
    tr: Translation = recovering
    to = await gw.resolve(call.model, call.capability)
    request[MODEL] = to.model
    if notice := notices(call.body, to.entry):  # tools or thinking the template cannot show: said, not hidden
        call = dataclasses.replace(call, headers={**call.headers, **notice})
    if (gate := gate_for(request, group=surface.group, model=to.model, body=call.body)) is not None:
        request[GATE] = gate
    await check_request(gate)  # the safety policy's judges, before the engine sees it (docs/safety.md)
    if call.has_images:  # checked (fetched, decoded) before a lane starts for them, in call.body itself
        await check_request_images(
            call.body, model=to.model, entry=to.entry, settings=gw.rt.settings, label=call.param or ""
        )
    resp: web.StreamResponse | None = None
    if call.stream and gw.needs_start(to):
        resp = encoding.stream_response(headers=call.headers)
        if not await wait_in_stream(request, resp, gw=gw, route=to, waiting=tr.waiting, failed=tr.failed):
            return resp
    t_load = time.perf_counter()
    try:
        async with gw.hold(to) as target:
            tr.loaded(time.perf_counter() - t_load)
            route = "chat" if call.path == "/v1/chat/completions" else "completions"
            facts = to.entry.facts if to.entry is not None else None
            template = facts.chat_template if facts is not None else None
            if route == "chat" and needs_forced_call(call.body, engine=target.engine, chat_template=template):
                # a required call the template cannot offer: asked as a call's JSON (forced_call.py)
                call = dataclasses.replace(call, body=forced_call_body(call.body))
                recovering.recovery.forced = True
            await gw.check(
                target,
                call.body,
                route=route,
                body_bytes=call.size,
                has_images=call.has_images,
                param=call.param,
            )
            if (slotted := await gw.pin_slot(target, call.body, route=route)) is not None:
                call = dataclasses.replace(call, body=slotted)  # its llama.cpp slot (the session bank)
            if (clamped := clamp_to_slot(target, call.body)) is not None:  # more output than the slot holds
                call = dataclasses.replace(call, body=clamped[0])
                note(request, clamped[1])
            if call.stream and not answers_judged(gate) and _raw_fits(request, gw, target, resp):
                return await _stream_raw(request, gw, target, call, tr, resp, encoding)
            upstream = await gw.post(target, call.path, call.body, stream=True)
            if call.stream:
                return await _stream(request, gw, target, upstream, call, tr, resp, encoding)
            try:
                await _fold(request, gw.deltas(target, upstream), tr)
            except SwitchyardError as exc:
                if route != "chat" or not takes_raw_path(exc, call.body, engine=target.engine):
                    raise
                # the engine's own parser refused its answer: asked again raw, into a fresh translation
                tr = RecoveringRun(TranslatedRun(translator, encoding=encoding), model=call.model)
                await _fold(request, raw_tool_deltas(gw.post_json, target, call.body), tr)
            finally:
                upstream.close()  # closing (not releasing) drops the socket: the engine stops work for us
            await _settle(gw, target, call, tr)
    except SwitchyardError as exc:
        if resp is None:
            raise
        await _write(resp, tr.failed(exc))  # the stream said 200 already: the error goes in it
        return resp
    if (usage := tr.usage()) is not None:
        request[USAGE] = usage
    answer = web.json_response(tr.whole(), headers=call.headers)
    await answer.prepare(request)  # answered before anything the route does next (Ollama's unload)
    await answer.write_eof()
    return answer


async def _fold(request: web.Request, source: AsyncGenerator[Delta, None], tr: Translation) -> None:
    """Feed a whole answer's deltas to `tr` (judged where the request's policy judges answers)."""
    async with contextlib.aclosing(judging(request, source)) as deltas:
        async for delta in deltas:
            tr.feed(delta)
            if tr.stopped:
                break


async def _stream(
    request: web.Request,
    gw: Gateway,
    target: Target,
    upstream: aiohttp.ClientResponse,
    call: Call,
    tr: Translation,
    resp: web.StreamResponse | None,
    encoding: Encoding,
) -> web.StreamResponse:
    async def pump() -> None:
        try:
            async with contextlib.aclosing(judging(request, gw.deltas(target, upstream))) as deltas:
                async for delta in deltas:
                    if out := tr.feed(delta):
                        await resp_.write(out)
                        if FIRST_BYTE not in request:
                            request[FIRST_BYTE] = time.perf_counter()
                    if tr.stopped:
                        break
        finally:
            upstream.close()

    try:
        resp_ = resp or await _prepared(request, encoding, call, chunked=False)
    except _RESETS:
        upstream.close()
        return resp or web.StreamResponse()
    return await _translated(request, gw, target, call, tr, resp_, pump)


async def _prepared(
    request: web.Request, encoding: Encoding, call: Call, *, chunked: bool
) -> web.StreamResponse:
    resp = encoding.stream_response(headers=call.headers)
    if chunked:
        resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp


async def _translated(
    request: web.Request,
    gw: Gateway,
    target: Target,
    call: Call,
    tr: Translation,
    resp: web.StreamResponse,
    pump: Callable[[], Awaitable[None]],
    *,
    pump_opens: bool = False,
) -> web.StreamResponse:
    """A translated stream around `pump` (which feeds the engine's deltas to `tr` and writes what comes
    out): the opening, the prompt count a stop sequence needs, the closing, an error in the stream.
    `pump_opens`: the pump writes the opening itself, once the engine's first chunk told the prompt's
    size (relay.translate_raw), so no count is asked of the engine before it."""
    try:
        try:
            if pump_opens:
                await resp.write(b"")  # the headers go out now: what follows is written under them
            else:
                if target.tokenizes:  # an opening that reports the prompt's size (Anthropic's message_start)
                    await _settle(gw, target, call, tr)
                await resp.write(tr.opening())  # the headers go out with it
            await pump()
            await _settle(gw, target, call, tr)
            await resp.write(tr.pending_opening() + tr.closing())
            if (usage := tr.usage()) is not None:
                request[USAGE] = usage
        except SwitchyardError as exc:  # mid-stream: the status is sent already, so say it as events
            await resp.write(tr.pending_opening() + tr.failed(exc))
        await resp.write_eof()
    except _RESETS:
        log.info("client went away mid-stream; closing the upstream request")
    return resp


def _raw_fits(request: web.Request, gw: Gateway, target: Target, resp: web.StreamResponse | None) -> bool:
    """Whether the stream can be translated in the engine socket's callback (relay.translate_raw): a local
    engine, an HTTP/1.1 client, a chunked response."""
    return (
        gw.can_relay_raw(target)
        and request.version == aiohttp.HttpVersion11
        and (resp is None or resp.chunked)
    )


async def _stream_raw(
    request: web.Request,
    gw: Gateway,
    target: Target,
    call: Call,
    tr: Translation,
    resp: web.StreamResponse | None,
    encoding: Encoding,
) -> web.StreamResponse:
    """`_stream` without a read loop: the engine's events are translated as they arrive."""
    # an opening that reports the prompt's size (Anthropic's message_start) takes it from the engine's
    # first chunk (llama.cpp's `return_progress`, sent as the prompt's reading begins), not from a render
    # and a tokenize asked of the engine first: two calls fewer per request. Other engines are counted
    # first, as before (an unknown field is theirs to refuse)
    opens = target.tokenizes and tr.wants_prompt_count() and speaks_llama_server(target.engine)
    sent = {**call.body, "model": target.served_name, **({"return_progress": True} if opens else {})}
    proto = await gw.open_stream(target, call.path, json.dumps(sent).encode())
    try:
        resp = resp or await _prepared(request, encoding, call, chunked=True)
        return await _translated(
            request,
            gw,
            target,
            call,
            tr,
            resp,
            lambda: translate_raw(request, proto, target, tr, opens=opens),
            pump_opens=opens,
        )
    except _RESETS:
        log.info("client went away before the stream began; closing the upstream request")
        return resp or web.StreamResponse()
    finally:
        proto.close()


async def _settle(gw: Gateway, target: Target, call: Call, tr: Translation) -> None:
    """Count the prompt ourselves where the translator wants it: before an opening that reports it, or
    after a stop sequence cut the engine off before its usage report."""
    if not tr.wants_prompt_count():
        return
    try:
        tr.prompt_counted(await gw.count_prompt(target, call.body))
    except SwitchyardError as exc:
        log.info("could not count prompt tokens for %s: %s", call.model, exc.message)


async def _write(resp: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(*_RESETS):
        await resp.write(data)
