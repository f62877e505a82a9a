"""One live transcription session on a WebSocket (OpenAI's Realtime transcription events).

Audio arrives as base64 PCM16 at 24 kHz and is resampled to whisper's 16 kHz. With server VAD, Silero cuts
it into speech segments in this process: each segment is committed and transcribed on its model's lane
(streamed, so deltas arrive as whisper decodes), and silence never reaches the engine. Without VAD the
client commits; a committed buffer holding no speech is answered without an engine call. A malformed
event gets an `error` event and the session goes on; the session ends at its length cap, and a client
that goes away cancels its transcriptions, which frees the lane.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web

from app.core.errors import BadRequestError, SwitchyardError
from app.server.gateway.core import Gateway
from app.server.realtime.config import IN_RATE, SessionConfig, apply_update, session_object
from app.server.realtime.speech_stream import sse_events, upload, wav16
from app.server.realtime.vad import FRAME, SpeechStarted, VadConfig, VadModel, VadStream
from app.server.realtime.vad import Segmenter as VadSegmenter

MIN_COMMIT_S = 0.1  # OpenAI refuses a commit of less than 100 ms


class BufferFullError(BadRequestError):
    code = "input_audio_buffer_full"  # OpenAI's event error codes, so clients can tell them apart


class CommitEmptyError(BadRequestError):
    code = "input_audio_buffer_commit_empty"


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True, kw_only=True)
class SessionLimits:
    max_session_s: float  # audio received, and wall time: whichever comes first
    max_buffer_s: float  # uncommitted audio


class Resampler:
    """24 kHz to 16 kHz in a stream: three input samples make two output samples, the rest waits."""

    def __init__(self) -> None:
        self._rest = np.zeros(0, dtype=np.float32)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        data = np.concatenate([self._rest, samples])
        whole = data.size // 3 * 3
        self._rest = data[whole:]
        if not whole:
            return np.zeros(0, dtype=np.float32)
        pos = np.arange(whole // 3 * 2) * 1.5
        return np.interp(pos, np.arange(whole), data[:whole]).astype(np.float32)


def pcm16_samples(audio: str) -> np.ndarray:
    """Base64 PCM16 as float samples; BadRequestError for bad base64 or half a sample."""
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequestError("`audio` is not valid base64", param="audio") from exc
    if len(raw) % 2:
        raise BadRequestError(
            "`audio` must hold whole 16-bit samples (an even number of bytes)", param="audio"
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768


def error_event(code: str, message: str, *, param: str | None = None, about: Any = None) -> dict[str, Any]:
    return {
        "type": "error",
        "event_id": _id("event"),
        "error": {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": param,
            "event_id": about if isinstance(about, str) else None,
        },
    }


class RealtimeSession:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        *,
        gateway: Gateway,
        vad: VadModel,
        limits: SessionLimits,
        config: SessionConfig,
    ) -> None:
        self.ws = ws
        self.gw = gateway
        self.vad = vad
        self.limits = limits
        self.config = config
        self.id = _id("sess")
        self.received = 0  # input samples (24 kHz) over the session
        self._resampler = Resampler()
        self._segmenter = self._new_segmenter()
        self._manual: list[np.ndarray] = []  # the uncommitted buffer without VAD (16 kHz)
        self._item: str | None = None  # the item the current speech belongs to
        self._last_item: str | None = None
        self._queue: asyncio.Queue[tuple[str, np.ndarray]] = asyncio.Queue()

    def _new_segmenter(self) -> VadSegmenter | None:
        return VadSegmenter(self.vad, self.config.vad) if self.config.vad is not None else None

    async def send(self, event: dict[str, Any]) -> None:
        if not self.ws.closed:
            event.setdefault("event_id", _id("event"))
            await self.ws.send_json(event)

    # ---- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        worker = asyncio.ensure_future(self._transcriber())
        deadline = time.monotonic() + self.limits.max_session_s
        try:
            await self.send({"type": "session.created", "session": session_object(self.id, self.config)})
            while not self.ws.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    await self._expire()
                    break
                try:
                    msg = await self.ws.receive(timeout=left)
                except TimeoutError:
                    continue
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    break
                if msg.type is not WSMsgType.TEXT:
                    await self.send(error_event("invalid_event", "send events as JSON text messages"))
                    continue
                if not await self._handle(msg.data):
                    break
            if not self.ws.closed:  # a clean end: the transcriptions already committed are finished
                await self._queue.join()
        finally:
            worker.cancel()  # a client that went away: its transcription is cancelled, the lane freed
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _expire(self) -> None:
        await self.send(
            error_event(
                "session_expired",
                f"the session reached its {self.limits.max_session_s:g} s limit "
                "(realtime_max_session_s); open a new session to go on",
            )
        )
        await self.ws.close()

    async def _handle(self, text: str) -> bool:
        """One client event; False when the session must end."""
        try:  # a large append (megabytes of base64) is parsed off the event loop
            event = json.loads(text) if len(text) < 1 << 16 else await asyncio.to_thread(json.loads, text)
        except ValueError:
            await self.send(error_event("invalid_json", "the event is not valid JSON; send one JSON object"))
            return True
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.send(error_event("invalid_event", "an event is a JSON object with a string `type`"))
            return True
        kind, about = event["type"], event.get("event_id")
        try:
            if kind in ("transcription_session.update", "session.update"):
                await self._update(event)
            elif kind == "input_audio_buffer.append":
                return await self._append(event)
            elif kind == "input_audio_buffer.commit":
                await self._commit()
            elif kind == "input_audio_buffer.clear":
                self._manual, self._segmenter, self._item = [], self._new_segmenter(), None
                await self.send({"type": "input_audio_buffer.cleared"})
            else:
                raise BadRequestError(
                    f"event type {kind!r} is not served on a transcription session; send "
                    "transcription_session.update, input_audio_buffer.append, .commit or .clear",
                    param="type",
                )
        except SwitchyardError as exc:
            await self.send(error_event(exc.code, exc.message, param=exc.param, about=about))
        return True

    # ---- events --------------------------------------------------------------------------------------
    async def _update(self, event: dict[str, Any]) -> None:
        config = apply_update(event, self.config)
        if config.model is not None and config.model != self.config.model:
            await self.gw.resolve(config.model, "transcription")  # unknown, or not a transcriber: refused
        changed = config.vad != self.config.vad
        self.config = config
        if changed:  # new turn settings start from an empty buffer
            self._manual, self._item, self._segmenter = [], None, self._new_segmenter()
        kind = "session.updated" if event["type"] == "session.update" else "transcription_session.updated"
        await self.send({"type": kind, "session": session_object(self.id, config)})

    async def _append(self, event: dict[str, Any]) -> bool:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise BadRequestError("`audio` must be base64 PCM16 (24 kHz mono) in a string", param="audio")
        # decoding, resampling and voice detection are CPU work on up to a minute of audio per event: in a
        # thread, so one client's append never stalls the others (one session's events stay in order)
        samples = await asyncio.to_thread(pcm16_samples, audio)
        self.received += samples.size
        if self.received > self.limits.max_session_s * IN_RATE:
            await self._expire()
            return False
        pcm = await asyncio.to_thread(self._resampler.feed, samples)
        if self._segmenter is None:
            if sum(a.size for a in self._manual) + pcm.size > self.limits.max_buffer_s * 16000:
                raise BufferFullError(
                    f"the input audio buffer is full ({self.limits.max_buffer_s:g} s, "
                    "realtime_max_buffer_s): commit it (input_audio_buffer.commit) before appending more",
                    param="audio",
                )
            self._manual.append(pcm)
            return True
        for seg_event in await asyncio.to_thread(self._segmenter.feed, pcm):
            if isinstance(seg_event, SpeechStarted):
                self._item = _id("item")
                await self.send(
                    {
                        "type": "input_audio_buffer.speech_started",
                        "audio_start_ms": seg_event.start_ms,
                        "item_id": self._item,
                    }
                )
            else:
                await self._stopped(seg_event.end_ms, seg_event.audio)
        if self._segmenter.buffered_samples > self.limits.max_buffer_s * 16000:
            cut = self._segmenter.cut()  # a long speech is cut at the buffer cap, not refused
            if cut is not None:
                await self._stopped(cut.end_ms, cut.audio)
        return True

    async def _stopped(self, end_ms: int, audio: np.ndarray) -> None:
        item = self._item or _id("item")
        await self.send(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": end_ms, "item_id": item}
        )
        await self._committed(item, audio)

    async def _committed(self, item: str, audio: np.ndarray) -> None:
        await self.send(
            {"type": "input_audio_buffer.committed", "item_id": item, "previous_item_id": self._last_item}
        )
        self._last_item, self._item = item, None
        self._queue.put_nowait((item, audio))

    async def _commit(self) -> None:
        if self._segmenter is not None:
            cut = self._segmenter.cut()
            if cut is None:
                raise CommitEmptyError(
                    "nothing to commit: no speech is in the buffer (server VAD commits each segment itself)",
                    param=None,
                )
            await self._stopped(cut.end_ms, cut.audio)
            return
        audio = np.concatenate(self._manual) if self._manual else np.zeros(0, dtype=np.float32)
        if audio.size < MIN_COMMIT_S * 16000:
            raise CommitEmptyError(
                f"the buffer holds {audio.size / 16:.0f} ms of audio; commit at least 100 ms",
            )
        self._manual = []
        await self._committed(_id("item"), audio)

    # ---- transcription -------------------------------------------------------------------------------
    async def _transcriber(self) -> None:
        while True:
            item, audio = await self._queue.get()
            try:
                await self._transcribe(item, audio)
            finally:
                self._queue.task_done()

    def _has_speech(self, audio: np.ndarray) -> bool:
        stream: VadStream = self.vad.stream()
        threshold = (self.config.vad or VadConfig()).threshold
        return any(
            stream.prob(audio[i : i + FRAME]) >= threshold for i in range(0, audio.size - FRAME + 1, FRAME)
        )

    async def _transcribe(self, item: str, audio: np.ndarray) -> None:
        seconds = round(audio.size / 16000, 3)
        done: dict[str, Any] = {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": item,
            "content_index": 0,
            "transcript": "",
            "usage": {"type": "duration", "seconds": seconds},
        }
        if self.config.vad is None and not await asyncio.to_thread(self._has_speech, audio):
            await self.send(done)  # silence: answered without the engine
            return
        try:
            done["transcript"] = await self._on_lane(item, audio)
        except SwitchyardError as exc:
            await self.send(
                {
                    "type": "conversation.item.input_audio_transcription.failed",
                    "item_id": item,
                    "content_index": 0,
                    "error": {"type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param},
                }
            )
            return
        await self.send(done)

    async def _on_lane(self, item: str, audio: np.ndarray) -> str:
        model = self.config.model
        if model is None:
            raise BadRequestError(
                "no transcription model is set: send transcription_session.update with "
                "input_audio_transcription.model (a whisper model from GET /v1/models)",
                param="model",
            )
        fields = {"response_format": "json"}
        if self.config.language:
            fields["language"] = self.config.language
        if self.config.prompt:
            fields["prompt"] = self.config.prompt
        route = await self.gw.resolve(model, "transcription")
        text = ""
        async with self.gw.hold(route) as target:
            body, ctype = upload(model=target.served_name, audio=wav16(audio), fields=fields)
            upstream = await self.gw.post(
                target, "/v1/audio/transcriptions", body, stream=True, content_type=ctype
            )
            try:
                async for event in sse_events(target, upstream):
                    if event.get("type") == "transcript.text.delta":
                        delta = str(event.get("delta", ""))
                        await self.send(
                            {
                                "type": "conversation.item.input_audio_transcription.delta",
                                "item_id": item,
                                "content_index": 0,
                                "delta": delta,
                            }
                        )
                    elif event.get("type") == "transcript.text.done":
                        text = str(event.get("text", ""))
            finally:
                upstream.close()
        return text
