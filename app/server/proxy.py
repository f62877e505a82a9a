"""The OpenAI pass-through: chat, completions, embeddings (and rerank) bytes in, bytes out.

The body is checked (app/server/validate.py), the model resolved and its lane held through the gateway,
then the engine's answer is relayed unbuffered (app/server/relay.py). One rewrite: a named tool_choice
becomes the form llama.cpp enforces (pin_named_tool_choice); a remote model's body carries the remote's
name for it. A non-streamed chat or completion for a local llama.cpp engine is asked of it as a stream and
answered whole (app/server/whole.py): a client that leaves then stops the engine's work. A stream whose
model is still loading hears SSE comment lines with the phase; once its headers are out, a failure is a
`data: {error envelope}` event. A stream with tools from an engine other than llama.cpp is read for
tool calls the engine reported but did not send (app/server/tool_recovery.py StreamRecovery).
"""

from __future__ import annotations

import contextlib
import json

import aiohttp
from aiohttp import web

from app.core.errors import SwitchyardError
from app.lanes.target import Target
from app.server.gateway import Gateway, chat_has_images
from app.server.images import check_request_images
from app.server.keys import GATEWAY
from app.server.metrics import DRAFT_UNSUITED, note_usage
from app.server.raw_http import read_all
from app.server.relay import keep_header, raw_relay_fits, relay, relay_raw
from app.server.request_keys import MODEL
from app.server.safety_gate import answers_judged, check_request, gate_for, judged_answer
from app.server.surface import OPENAI
from app.server.tool_recovery import StreamRecovery, recover_answer, stream_needs_recovery
from app.server.translate_engine import pin_named_tool_choice
from app.server.validate import check, parse_body

_CAPABILITY_FOR_ROUTE = {"chat": "chat", "completions": "completions", "embeddings": "embeddings"}


async def forward(request: web.Request, *, route: str, path: str) -> web.StreamResponse:
    raw = await request.read()
    body = parse_body(raw)
    request[MODEL] = check(body, route)
    gw = request.app[GATEWAY]
    to = await gw.resolve(request[MODEL], _CAPABILITY_FOR_ROUTE.get(route, route))
    request[MODEL] = to.model
    if route == "chat" and (pinned := pin_named_tool_choice(body)) is not None:
        body, raw = pinned, json.dumps(pinned).encode()  # llama.cpp would drop a named tool_choice
    if route == "chat":  # images checked (fetched, decoded) before a lane starts for them
        seen = await check_request_images(body, model=to.model, entry=to.entry, settings=gw.rt.settings)
        if seen.changed:
            raw = json.dumps(body).encode()
    gate = gate_for(request, group="openai", model=to.model, body=body) if route != "embeddings" else None
    await check_request(gate)  # the safety policy's judges, before the engine sees it (docs/safety.md)
    stream = body.get("stream") is True
    resp: web.StreamResponse | None = None
    if stream and gw.needs_start(to):
        resp = OPENAI.stream_response()
        if request.version == aiohttp.HttpVersion11:
            resp.enable_chunked_encoding()  # what the byte relay writes under (relay_raw)
        await resp.prepare(request)

        async def tick(phase: str, seconds: float) -> None:
            assert resp is not None
            await resp.write(OPENAI.loading(to.model, phase, seconds))

        try:
            await gw.wait_ready(to, tick=tick)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return resp  # the client went away; the start goes on for the next request
        except SwitchyardError as exc:
            await _write_error(resp, exc)
            return resp
    try:
        async with gw.hold(to) as target:
            await gw.check(
                target,
                body,
                route=route,
                body_bytes=len(raw),
                has_images=route == "chat" and chat_has_images(body),
            )
            if (slotted := await gw.pin_slot(target, body, route=route)) is not None:
                body, raw = slotted, json.dumps(slotted).encode()  # its llama.cpp slot (the session bank)
            if (unsuited := gw.draft_unsuited(target, body)) is not None:
                request[DRAFT_UNSUITED] = unsuited  # counted in /metrics; a whole answer's timings say it
            # a stream with tools from an engine other than llama.cpp is read for lost calls (mlx-lm#1957)
            recover = stream and route == "chat" and stream_needs_recovery(body, engine=target.engine)
            recovery = StreamRecovery(target.model_id) if recover else None
            raw_ok = gw.can_relay_raw(target) and request.version == aiohttp.HttpVersion11
            if gate is not None and answers_judged(gate):  # the answer held back until judged
                return await judged_answer(request, gate, gw, target, path, body, resp, route=route)
            if stream and not recover and raw_ok:
                return await _relay_local(request, gw, target, path, raw, resp)
            if not stream and gw.answers_whole(target, route, body):
                # asked as a stream: an engine stops a stream whose client went away, not a whole answer
                data = await gw.whole(target, path, body, route=route)
                note_usage(request, data)
                return web.Response(body=data, content_type="application/json")
            # a local engine gets the client's bytes untouched; a remote, the body with its own model name
            upstream = await gw.post(target, path, raw if to.remote is None else body, stream=stream)
            if "text/event-stream" in upstream.headers.get("Content-Type", ""):
                return await relay(request, upstream, target, resp, edit=recovery)
            data = await gw.read(target, upstream)
            if route == "chat" and upstream.status == 200:
                data = recover_answer(data, model=target.model_id)  # a reported call it did not send
            if resp is not None:  # the headers went out with the loading comments
                await resp.write(data if data.startswith(b"data:") else b"data: " + data + b"\n\n")
                return resp
            note_usage(request, data)
            headers = {k: v for k, v in upstream.headers.items() if keep_header(k)}
            return web.Response(body=data, status=upstream.status, headers=headers)
    except SwitchyardError as exc:
        if resp is None:
            raise
        await _write_error(resp, exc)  # the stream already answered 200: the error goes in it
        return resp


async def _write_error(resp: web.StreamResponse, exc: SwitchyardError) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await resp.write(OPENAI.stream_error(exc))


async def _relay_local(
    request: web.Request,
    gw: Gateway,
    target: Target,
    path: str,
    raw: bytes,
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    """A local engine's stream through the protocol-level relay; an answer that is not a chunked event
    stream (an engine that answers whole) is passed on as it came."""
    proto = await gw.open_stream(target, path, raw)
    if raw_relay_fits(request, proto, resp):
        return await relay_raw(request, proto, target, resp)
    try:
        data = await read_all(proto)
    finally:
        proto.close()
    if resp is not None:
        await resp.write(data if data.startswith(b"data:") else b"data: " + data + b"\n\n")
        return resp
    _, headers = proto.head.result()
    return web.Response(body=data, content_type=headers.get("content-type", "application/json").split(";")[0])
