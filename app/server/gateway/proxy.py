"""The OpenAI pass-through: chat, completions, embeddings (and rerank) bytes in, bytes out.

The body is checked (surfaces/openai/validate.py), the model resolved and its lane held through the gateway,
then the engine's answer is relayed unbuffered (app/server/gateway/relay.py). One rewrite: a named tool_choice
becomes the form llama.cpp enforces (pin_named_tool_choice); a remote model's body carries the remote's
name for it. A non-streamed chat or completion for a local llama.cpp engine is asked of it as a stream and
answered whole (gateway/whole.py): a client that leaves then stops the engine's work. A stream whose
model is still loading hears SSE comment lines with the phase; once its headers are out, a failure is a
`data: {error envelope}` event. A stream with tools from an engine other than llama.cpp is read for
tool calls the engine reported but did not send (app/server/gateway/tool_recovery.py StreamRecovery).
"""

from __future__ import annotations

import contextlib
import functools
import json

import aiohttp
from aiohttp import web

from app.core.errors import SwitchyardError
from app.lanes.lane_requests import speaks_llama_server
from app.lanes.target import Target
from app.server.gateway.body_bytes import changed_body
from app.server.gateway.completion_ids import CompletionIds
from app.server.gateway.core import Gateway, chat_has_images
from app.server.gateway.forced_call import forced_call_body, needs_forced_call
from app.server.gateway.images import check_request_images
from app.server.gateway.output_clamp import clamp_to_slot
from app.server.gateway.raw_http import read_all
from app.server.gateway.relay import StreamEdit, keep_header, raw_relay_fits, relay, relay_raw
from app.server.gateway.response_notes import note
from app.server.gateway.safety_gate import answers_judged, check_request, gate_for, judged_answer
from app.server.gateway.tool_notice import thinking_ignored
from app.server.gateway.tool_recovery import StreamRecovery, recover_answer, stream_needs_recovery
from app.server.gateway.waiting import wait_in_stream
from app.server.keys import GATEWAY
from app.server.metrics import DRAFT_UNSUITED, note_usage
from app.server.request_keys import MODEL
from app.server.surfaces.base import OPENAI, surface_of
from app.server.surfaces.openai.dimensions import cut_answer, engine_body, wanted_dimensions
from app.server.surfaces.openai.validate import check, parse_body
from app.server.surfaces.shapes import pin_named_tool_choice
from app.server.surfaces.thinking import with_reasoning_effort

_CAPABILITY_FOR_ROUTE = {"chat": "chat", "completions": "completions", "embeddings": "embeddings"}


LOGPROBS_HEADER = "X-Switchyard-Logprobs"  # why an answer's logprobs cover only some of its tokens


async def forward(request: web.Request, *, route: str, path: str) -> web.StreamResponse:
    raw = await request.read()
    body = parse_body(raw)
    request[MODEL] = check(body, route)
    gw = request.app[GATEWAY]
    to = await gw.resolve(request[MODEL], _CAPABILITY_FOR_ROUTE.get(route, route))
    request[MODEL] = to.model
    if route == "chat" and (pinned := pin_named_tool_choice(body)) is not None:
        body, raw = pinned, json.dumps(pinned).encode()  # llama.cpp would drop a named tool_choice
    if route == "chat" and (thinking := with_reasoning_effort(body)) is not None:
        body, raw = thinking, json.dumps(thinking).encode()  # the effort as the template's switches
    if route == "chat" and body.get("reasoning_effort") is not None:
        note(request, thinking_ignored(body, to.entry))  # a template without the switch: said, not hidden
    dims = wanted_dimensions(body) if route == "embeddings" else None
    if dims is not None:  # llama.cpp ignores `dimensions`: whole float vectors, cut here (dimensions.py)
        encoding = str(body.get("encoding_format") or "float")
        body = engine_body(body)
        raw = json.dumps(body).encode()
    if route == "chat":  # images checked (fetched, decoded) before a lane starts for them
        seen = await check_request_images(body, model=to.model, entry=to.entry, settings=gw.rt.settings)
        if seen.changed:
            raw = json.dumps(body).encode()
    surface = surface_of(request)
    if surface is None:
        raise TypeError(f"{request.path} is no surface's route: install it through SURFACES to forward it")
    gate = (
        gate_for(request, group=surface.group, model=to.model, body=body) if route != "embeddings" else None
    )
    await check_request(gate)  # the safety policy's judges, before the engine sees it (docs/safety.md)
    stream = body.get("stream") is True
    resp: web.StreamResponse | None = None
    if stream and gw.needs_start(to):
        resp = OPENAI.stream_response()
        loading = functools.partial(OPENAI.loading, to.model)
        if not await wait_in_stream(
            request, resp, gw=gw, route=to, waiting=loading, failed=OPENAI.stream_error
        ):
            return resp
    try:
        async with gw.hold(to) as target:
            # a required call to a model whose template renders no tools: asked as a call's JSON instead
            facts = to.entry.facts if to.entry is not None else None
            template = facts.chat_template if facts is not None else None
            forced = route == "chat" and needs_forced_call(body, engine=target.engine, chat_template=template)
            if forced:
                body = forced_call_body(body)
                raw = json.dumps(body).encode()
            await gw.check(
                target,
                body,
                route=route,
                body_bytes=len(raw),
                has_images=route == "chat" and chat_has_images(body),
            )
            if (slotted := await gw.pin_slot(target, body, route=route)) is not None:
                raw = changed_body(raw, body, slotted)  # its llama.cpp slot (the session bank)
                body = slotted
            if route != "embeddings" and (clamped := clamp_to_slot(target, body)) is not None:
                raw = changed_body(raw, body, clamped[0])  # more output than the slot holds
                body = clamped[0]
                note(request, clamped[1])
            if (partial := target.logprobs_partial(body)) is not None:
                note(request, {LOGPROBS_HEADER: partial})  # said, since they cannot all be returned
            if (unsuited := gw.draft_unsuited(target, body)) is not None:
                request[DRAFT_UNSUITED] = unsuited  # counted in /metrics; a whole answer's timings say it
            # a stream with tools from an engine other than llama.cpp is read for lost calls (mlx-lm#1957)
            recover = (
                stream and route == "chat" and (forced or stream_needs_recovery(body, engine=target.engine))
            )
            edit: StreamEdit | None = StreamRecovery(target.model_id, forced=forced) if recover else None
            if stream and route == "completions" and speaks_llama_server(target.engine):
                edit = CompletionIds()  # llama.cpp ids every answer as a chat one
            raw_ok = gw.can_relay_raw(target) and request.version == aiohttp.HttpVersion11
            if gate is not None and answers_judged(gate):  # the answer held back until judged
                return await judged_answer(request, gate, gw, target, path, body, resp, route=route)
            if stream and edit is None and raw_ok:
                return await _relay_local(request, gw, target, path, raw, resp)
            if not stream and gw.answers_whole(target, route, body):
                # asked as a stream: an engine stops a stream whose client went away, not a whole answer
                data = await gw.whole(target, path, body, route=route)
                if forced:
                    data = recover_answer(data, model=target.model_id, forced=True)
                note_usage(request, data)
                return web.Response(body=data, content_type="application/json")
            # a local engine gets the client's bytes untouched; a remote, the body with its own model name
            upstream = await gw.post(target, path, raw if to.remote is None else body, stream=stream)
            if "text/event-stream" in upstream.headers.get("Content-Type", ""):
                return await relay(request, upstream, target, resp, edit=edit)
            data = await gw.read(target, upstream)
            if dims is not None and upstream.status == 200:
                data = cut_answer(data, dimensions=dims, encoding=encoding)
            if route == "chat" and upstream.status == 200:
                data = recover_answer(
                    data, model=target.model_id, forced=forced
                )  # a reported call it did not send
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
