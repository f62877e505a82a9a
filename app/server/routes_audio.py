"""OpenAI's audio routes, routed by `model` like chat: speech (Piper), transcriptions and translations
(whisper.cpp), or a remote's model. A model whose lane cannot do the route's task gets a 400 naming the
lanes that can."""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.errors import BadRequestError
from app.server.lane_call import call_lane, need_model
from app.server.multipart import form_field
from app.server.validate import parse_body

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


async def _audio_in(request: web.Request, *, capability: str, path: str) -> web.Response:
    ctype = request.headers.get("Content-Type", "")
    if not ctype.startswith("multipart/form-data"):
        raise BadRequestError(
            "send multipart/form-data with `file` and `model` fields (OpenAI's upload shape)"
        )
    raw = await request.read()
    # parsing an upload of many megabytes takes a while: off the event loop
    model = need_model(await asyncio.to_thread(form_field, raw, ctype, "model"))
    return await call_lane(
        request, model=model, capability=capability, path=path, body=raw, content_type=ctype
    )


@routes.post("/v1/audio/transcriptions")
async def transcriptions(request: web.Request) -> web.Response:
    """Speech to text on a whisper.cpp model (OpenAI's multipart upload)"""
    return await _audio_in(request, capability="transcription", path="/v1/audio/transcriptions")


@routes.post("/v1/audio/translations")
async def translations(request: web.Request) -> web.Response:
    """Speech to English text on a whisper.cpp model (OpenAI's multipart upload)"""
    return await _audio_in(request, capability="translation", path="/v1/audio/translations")
