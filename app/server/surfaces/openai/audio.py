"""OpenAI's audio routes, routed by `model` like chat: speech (Piper), transcriptions and translations
(whisper.cpp), or a remote's model. A model whose lane cannot do the route's task gets a 400 naming the
lanes that can."""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.errors import BadRequestError
from app.server.gateway.lane_call import call_lane, need_model, renamed_body
from app.server.gateway.multipart import form_parts
from app.server.keys import GATEWAY
from app.server.realtime.speech_stream import relay
from app.server.request_keys import MODEL
from app.server.surfaces.openai.validate import parse_body

routes = web.RouteTableDef()


@routes.post("/v1/audio/speech")
async def speech(request: web.Request) -> web.Response:
    """Text to speech on a Piper voice (OpenAI's shape; wav or pcm)"""
    raw = await request.read()
    body = parse_body(raw)
    model = need_model(body.get("model"))
    if not isinstance(body.get("input"), str):
        raise BadRequestError("missing required field 'input' (the text to speak)", param="input")
    return await call_lane(
        request,
        model=model,
        capability="speech",
        path="/v1/audio/speech",
        body=raw,
        content_type="application/json",
    )


async def _audio_in(request: web.Request, *, capability: str, path: str) -> web.StreamResponse:
    ctype = request.headers.get("Content-Type", "")
    if not ctype.startswith("multipart/form-data"):
        raise BadRequestError(
            "send multipart/form-data with `file` and `model` fields (OpenAI's upload shape)"
        )
    raw = await request.read()
    # parsing an upload of many megabytes takes a while: off the event loop
    fields = await asyncio.to_thread(_text_fields, raw, ctype)
    model = need_model(fields.get("model"))
    if fields.get("stream", "false").lower() not in ("true", "false"):
        raise BadRequestError("`stream` must be true or false", param="stream")
    if fields.get("stream", "").lower() == "true":
        if capability != "transcription":
            raise BadRequestError("stream=true is for transcriptions only; leave it out", param="stream")
        return await _streamed(request, model=model, path=path, body=raw, content_type=ctype)
    return await call_lane(
        request, model=model, capability=capability, path=path, body=raw, content_type=ctype
    )


def _text_fields(raw: bytes, ctype: str) -> dict[str, str]:
    return {
        p.name: p.data.decode(p.charset, errors="replace").strip()
        for p in form_parts(raw, ctype)
        if p.filename is None
    }


async def _streamed(
    request: web.Request, *, model: str, path: str, body: bytes, content_type: str
) -> web.StreamResponse:
    """`transcript.text.delta` events as the engine decodes each segment, then `transcript.text.done`."""
    gw = request.app[GATEWAY]
    request[MODEL] = model
    to = await gw.resolve(model, "transcription")
    request[MODEL] = to.model
    if to.remote is not None:
        body, content_type = await renamed_body(to.remote, body, content_type)
    async with gw.hold(to) as target:
        return await relay(request, target, path=path, body=body, content_type=content_type)


@routes.post("/v1/audio/transcriptions")
async def transcriptions(request: web.Request) -> web.StreamResponse:
    """Speech to text on a whisper.cpp model (OpenAI's multipart upload; stream=true for SSE deltas)"""
    return await _audio_in(request, capability="transcription", path="/v1/audio/transcriptions")


@routes.post("/v1/audio/translations")
async def translations(request: web.Request) -> web.StreamResponse:
    """Speech to English text on a whisper.cpp model (OpenAI's multipart upload)"""
    return await _audio_in(request, capability="translation", path="/v1/audio/translations")
