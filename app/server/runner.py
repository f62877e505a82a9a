"""The one runner of a translated route (Anthropic Messages, Responses, Ollama chat/generate):
parse → resolve → wait → hold → check → post → stream or collect → error in the stream.

A route parses its body into a `Call` (the OpenAI chat body the engine gets) and a `Translation` (the
engine's deltas in its own shape); everything else is here, once. The engine is always asked to stream:
a whole answer is collected from the same deltas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import SwitchyardError
from app.lanes.target import Target
from app.server.gateway import Gateway
from app.server.images import check_request_images
from app.server.keys import GATEWAY
from app.server.metrics import FIRST_BYTE, USAGE
from app.server.relay import translate_raw
from app.server.request_keys import MODEL
from app.server.safety_gate import GATE, answers_judged, check_request, gate_for, judging
from app.server.surface import Surface
from app.server.tool_recovery import RecoveringRun
from app.server.translation import Translation

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


async def run(request: web.Request, surface: Surface, call: Call, tr: Translation) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    request[MODEL] = call.model
    tr = RecoveringRun(tr, model=call.model)  # tool calls an engine reported but did not send
    to = await gw.resolve(call.model, call.capability)
    request[MODEL] = to.model
    group = "responses" if surface.name == "openai" else surface.name
    if (gate := gate_for(request, group=group, model=to.model, body=call.body)) is not None:
        request[GATE] = gate
    await check_request(gate)  # the safety policy's judges, before the engine sees it (docs/safety.md)
    if call.has_images:  # checked (fetched, decoded) before a lane starts for them, in call.body itself
        await check_request_images(
            call.body, model=to.model, entry=to.entry, settings=gw.rt.settings, label=call.param or ""
        )
    resp: web.StreamResponse | None = None
    if call.stream and gw.needs_start(to):
        resp = surface.stream_response(headers=call.headers)
        if request.version == aiohttp.HttpVersion11:
            resp.enable_chunked_encoding()  # what the protocol-level stream writes under (_stream_raw)
        await resp.prepare(request)

        async def tick(phase: str, seconds: float) -> None:
            assert resp is not None
            await resp.write(tr.waiting(phase, seconds))

        try:
            await gw.wait_ready(to, tick=tick)
        except _RESETS:
            return resp  # the client went away; the start goes on for the next request
        except SwitchyardError as exc:
            await _write(resp, tr.failed(exc))
            return resp
    t_load = time.perf_counter()
    try:
        async with gw.hold(to) as target:
            tr.loaded(time.perf_counter() - t_load)
            route = "chat" if call.path == "/v1/chat/completions" else "completions"
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
            if call.stream and not answers_judged(gate) and _raw_fits(request, gw, target, resp):
                return await _stream_raw(request, gw, target, call, tr, resp, surface)
            upstream = await gw.post(target, call.path, call.body, stream=True)
            if call.stream:
                return await _stream(request, gw, target, upstream, call, tr, resp, surface)
            try:
                async with contextlib.aclosing(judging(request, gw.deltas(target, upstream))) as deltas:
                    async for delta in deltas:
                        tr.feed(delta)
                        if tr.stopped:
                            break
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


async def _stream(
    request: web.Request,
    gw: Gateway,
    target: Target,
    upstream: aiohttp.ClientResponse,
    call: Call,
    tr: Translation,
    resp: web.StreamResponse | None,
    surface: Surface,
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
        resp_ = resp or await _prepared(request, surface, call, chunked=False)
    except _RESETS:
        upstream.close()
        return resp or web.StreamResponse()
    return await _translated(request, gw, target, call, tr, resp_, pump)


async def _prepared(
    request: web.Request, surface: Surface, call: Call, *, chunked: bool
) -> web.StreamResponse:
    resp = surface.stream_response(headers=call.headers)
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
) -> web.StreamResponse:
    """A translated stream around `pump` (which feeds the engine's deltas to `tr` and writes what comes
    out): the opening, the prompt count a stop sequence needs, the closing, an error in the stream."""
    try:
        try:
            await resp.write(tr.opening())  # the headers go out with it: what follows is written under them
            await pump()
            await _settle(gw, target, call, tr)
            await resp.write(tr.closing())
            if (usage := tr.usage()) is not None:
                request[USAGE] = usage
        except SwitchyardError as exc:  # mid-stream: the status is sent already, so say it as events
            await resp.write(tr.failed(exc))
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
    surface: Surface,
) -> web.StreamResponse:
    """`_stream` without a read loop: the engine's events are translated as they arrive."""
    body = json.dumps({**call.body, "model": target.served_name}).encode()
    proto = await gw.open_stream(target, call.path, body)
    try:
        resp = resp or await _prepared(request, surface, call, chunked=True)
        return await _translated(
            request, gw, target, call, tr, resp, lambda: translate_raw(request, proto, target, tr)
        )
    except _RESETS:
        log.info("client went away before the stream began; closing the upstream request")
        return resp or web.StreamResponse()
    finally:
        proto.close()


async def _settle(gw: Gateway, target: Target, call: Call, tr: Translation) -> None:
    """A stop sequence cut the engine off before its usage report: count the prompt ourselves."""
    if not tr.wants_prompt_count():
        return
    try:
        tr.prompt_counted(await gw.count_prompt(target, call.body))
    except SwitchyardError as exc:
        log.info("could not count prompt tokens for %s: %s", call.model, exc.message)


async def _write(resp: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(*_RESETS):
        await resp.write(data)
