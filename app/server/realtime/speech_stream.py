"""Streamed transcription through a lane: the multipart upload we build for a piece of live audio, and the
server-sent events (`transcript.text.delta`, `transcript.text.done`) read back from the engine."""

from __future__ import annotations

import io
import json
import uuid
import wave
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from app.lanes.target import Target
from app.server.keys import GATEWAY

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def wav16(samples: np.ndarray, *, rate: int = 16000) -> bytes:
    """16-bit mono WAV of float samples in [-1, 1]."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def upload(*, model: str, audio: bytes, fields: dict[str, str]) -> tuple[bytes, str]:
    """(body, content type) of OpenAI's transcription upload: `file` plus text fields, streamed."""
    boundary = f"switchyard-{uuid.uuid4().hex}"
    out = bytearray()
    for name, value in {"model": model, "stream": "true", **fields}.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    out += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="speech.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    out += audio + f"\r\n--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


async def sse_events(target: Target, upstream: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an SSE answer, in order; a broken connection is the target's failure."""
    try:
        while line := await target.bounded(upstream.content.readline()):
            text = line.decode("utf-8", errors="replace").strip()
            if text.startswith("data:") and (data := text[5:].strip()) and data != "[DONE]":
                event = json.loads(data)
                if isinstance(event, dict):
                    yield event
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise target.broken(exc) from exc


async def relay(
    request: web.Request, target: Target, *, path: str, body: bytes, content_type: str
) -> web.StreamResponse:
    """The engine's event stream passed through as it comes; the upstream closed when the client goes."""
    gw = request.app[GATEWAY]
    upstream = await gw.post(target, path, body, stream=True, content_type=content_type)
    try:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        while True:
            try:
                chunk = await target.bounded(upstream.content.readany())
            except (aiohttp.ClientError, OSError) as exc:  # the engine's side broke: said in the stream
                err = target.broken(exc)
                chunk = f"data: {json.dumps({'type': 'error', **err.envelope()})}\n\n".encode()
                await resp.write(chunk)
                break
            if not chunk:
                break
            await resp.write(chunk)  # a client that went away raises here, and the upstream is closed
        await resp.write_eof()
        return resp
    finally:
        upstream.close()
