"""`GET /v1/realtime?intent=transcription`: OpenAI's Realtime transcription API on a WebSocket.

The upgrade is an ordinary request to the middlewares: the Host, Origin and API key checks run on it before
the socket opens. The Silero model is loaded once, on the first session, and shared by all of them.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import WSCloseCode, web

from app.core.errors import BadRequestError
from app.server.keys import GATEWAY, RUNTIME
from app.server.realtime.config import SessionConfig
from app.server.realtime.session import RealtimeSession, SessionLimits, error_event
from app.server.realtime.vad import VadModel
from app.server.request_keys import MODEL

# one event: an append of about 60 s of 24 kHz PCM16 (base64) and its JSON. OpenAI takes up to 15 MiB, but
# a 15 MiB append is four minutes of audio to decode and run voice detection on at once; send it in parts
MAX_EVENT = 4 << 20
TOO_LARGE = (
    f"one event is at most {MAX_EVENT >> 20} MiB (about 60 s of 24 kHz audio in an append); send the audio "
    "in several input_audio_buffer.append events"
)


class RealtimeSocket(web.WebSocketResponse):
    """aiohttp closes the socket of an event over `max_msg_size` (1009) from inside `receive()`, before the
    session sees anything: the client hears why first, as the Realtime API's `error` event."""

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
        if code == WSCloseCode.MESSAGE_TOO_BIG and not self.closed:
            # a client that is gone (or still sending the event) may refuse the write: the close still goes
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send_json(error_event("event_too_large", TOO_LARGE))
            message = message or f"event over {MAX_EVENT >> 20} MiB".encode()
        return await super().close(code=code, message=message, drain=drain)


class VadHolder:
    """The one loaded VAD model of this app, loaded on first use (off the event loop)."""

    def __init__(self) -> None:
        self._model: VadModel | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> VadModel:
        async with self._lock:
            if self._model is None:
                self._model = await asyncio.to_thread(VadModel.load)
            return self._model


VAD: web.AppKey[VadHolder] = web.AppKey("vad", VadHolder)
TAG = "OpenAI"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/v1/realtime")
async def realtime(request: web.Request) -> web.StreamResponse:
    """Live transcription over a WebSocket (OpenAI's Realtime transcription events; server VAD)"""
    if request.query.get("intent") != "transcription":
        raise BadRequestError(
            "only transcription sessions are served: connect to /v1/realtime?intent=transcription "
            "(conversations with a realtime model are not)",
            param="intent",
        )
    ws = RealtimeSocket(max_msg_size=MAX_EVENT, heartbeat=30)
    if not ws.can_prepare(request).ok:
        raise BadRequestError("connect with a WebSocket (Upgrade: websocket) to use the Realtime API")
    vad = await request.app[VAD].get()  # before the upgrade: a missing package is a plain 503 answer
    model = request.query.get("model") or None
    if model is not None:
        request[MODEL] = model
        await request.app[GATEWAY].resolve(model, "transcription")
    settings = request.app[RUNTIME].settings
    limits = SessionLimits(
        max_session_s=settings.limits.realtime_max_session_s,
        max_buffer_s=settings.limits.realtime_max_buffer_s,
    )
    await ws.prepare(request)
    session = RealtimeSession(
        ws, gateway=request.app[GATEWAY], vad=vad, limits=limits, config=SessionConfig(model=model)
    )
    await session.run()
    await ws.close()
    return ws


def setup(app: web.Application) -> None:
    app[VAD] = VadHolder()
    app.add_routes(routes)
