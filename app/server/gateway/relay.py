"""The byte relay of a streamed answer: the engine's event stream written to the client as it arrives.

No JSON is parsed per event: the usage a stream reports is in its last events, so only the last two
pieces are kept and parsed once, at the end (for /metrics). A client that goes away closes the upstream
request (the engine stops generating and frees its slot); an upstream that breaks mid-stream ends the
client's stream with an error event naming the target. Every stream ends with `data: [DONE]`, added where
the engine ended without it (after an error event of its own).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import aiohttp
from aiohttp import web

from app.chat.deltas import StreamReader, StreamRefusal
from app.core import tracing
from app.core.errors import SwitchyardError
from app.lanes.target import Target
from app.server.gateway.raw_http import ChunkFrames, ChunkPayload, RawUpstream
from app.server.metrics import FIRST_BYTE, SENT_STATUS, note_usage
from app.server.surfaces.translation import Translation

log = logging.getLogger("switchyard.relay")
_monotonic = time.monotonic  # read per engine read: a module global, not an attribute of a module
_DONE = b"data: [DONE]\n\n"
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}
_RESETS = (ConnectionResetError, aiohttp.ClientConnectionResetError)


P = ParamSpec("P")
R = TypeVar("R")
U = TypeVar("U")


class StreamEdit(Protocol):
    """What rewrites a relayed stream on its way (app/server/gateway/tool_recovery.py StreamRecovery)."""

    def feed(self, data: bytes) -> bytes: ...

    def close(self) -> bytes: ...


def _stream_span(
    fn: Callable[Concatenate[web.Request, U, Target, P], Awaitable[R]],
) -> Callable[Concatenate[web.Request, U, Target, P], Awaitable[R]]:
    """The relay in a `switchyard.stream` span (docs/tracing.md), from the first byte to the last."""

    @functools.wraps(fn)
    async def traced(request: web.Request, up: U, target: Target, /, *a: P.args, **kw: P.kwargs) -> R:
        with tracing.span("switchyard.stream", model=target.model_id, lane=target.engine):
            return await fn(request, up, target, *a, **kw)

    return traced


def keep_header(name: str) -> bool:
    """Whether an upstream answer header is passed on: not hop-by-hop, and not the engine's own CORS answer
    (the gateway decides who may call it)."""
    low = name.lower()
    return low not in _HOP and not low.startswith("access-control-")


def _mark_sent(request: web.Request, resp: web.StreamResponse, tail: bytes) -> None:
    """Record a stream as answered in full, with the usage its last events carry (for /metrics); once:
    at its terminal event, and the relay's end finds it recorded (nothing comes after that event)."""
    if SENT_STATUS in request:
        return
    note_usage(request, tail)
    request[SENT_STATUS] = resp.status


@_stream_span
async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    target: Target,
    resp: web.StreamResponse | None = None,
    *,
    edit: StreamEdit | None = None,
) -> web.StreamResponse:
    """Relay `upstream`'s event stream to the client (through `resp` when it is prepared already), through
    `edit` when one is given (the events rewritten: lost tool calls recovered)."""
    try:
        if resp is None:
            resp = web.StreamResponse(status=upstream.status)
            resp.headers["Content-Type"] = upstream.headers.get("Content-Type", "text/event-stream")
            resp.headers["Cache-Control"] = "no-cache"
            resp.headers["X-Accel-Buffering"] = "no"
            await resp.prepare(request)
        if edit is not None:
            return await _pump_edited(request, upstream, target, resp, edit)
        return await _pump(request, upstream, target, resp)
    finally:
        upstream.close()  # closing (not releasing) an unfinished answer drops the socket: the engine stops


def whole_events(held: bytes, piece: bytes) -> tuple[bytes, bytes]:
    """`held` + `piece` cut after its last whole event (its blank line, LF or CRLF): what may go to the
    client now, and the start of an event still to be finished. An error event written after a stream
    broke then starts a line of its own, where it would otherwise be glued to half an event."""
    data = held + piece if held else piece
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return (data, b"") if cut == len(data) else (data[:cut], data[cut:])


async def _pump(
    request: web.Request, upstream: aiohttp.ClientResponse, target: Target, resp: web.StreamResponse
) -> web.StreamResponse:
    prev = last = held = b""
    content = upstream.content
    try:
        while chunk := await target.bounded(content.readany()):
            out, held = whole_events(held, chunk)
            if not out:
                continue
            await resp.write(out)
            if not last:
                request[FIRST_BYTE] = time.perf_counter()
            prev, last = last, out  # the usage is in the last events: keep two pieces, parse none
            if out.endswith(_DONE):
                # the answer is whole once its terminal event is out: a client that hangs up now, while
                # the engine is still closing its side, has read everything (counted 200, not 499)
                _mark_sent(request, resp, prev + last)
        if held:  # an answer that ended without a blank line after its last event: passed on as it came
            await resp.write(held)
            request.setdefault(FIRST_BYTE, time.perf_counter())
            prev, last = last, held
    except _RESETS:
        log.info("client went away mid-stream; closing the upstream request")
        return resp
    except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError, SwitchyardError) as exc:
        return await _failed(resp, target, exc)  # a half event held back never reaches the client
    _mark_sent(request, resp, prev + last)
    try:
        await _end_properly(resp, prev + last)
        await resp.write_eof()
    except _RESETS:
        pass
    return resp


async def _end_properly(resp: web.StreamResponse, tail: bytes) -> None:
    """The terminal event, where the engine ended its stream without one (after an error event of its
    own, as llama.cpp does when its output parser fails): an OpenAI stream always ends with [DONE]."""
    if _DONE not in tail[-64:]:
        await resp.write(_DONE)


async def _pump_edited(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    target: Target,
    resp: web.StreamResponse,
    edit: StreamEdit,
) -> web.StreamResponse:
    """`_pump` with every piece through `edit` (a slower path: only streams that need the rewrite)."""
    tail = held = b""
    try:
        while True:
            chunk = await target.bounded(upstream.content.readany())
            out, held = whole_events(held, edit.feed(chunk)) if chunk else (held + edit.close(), b"")
            if out:
                await resp.write(out)
                request.setdefault(FIRST_BYTE, time.perf_counter())
                tail = (tail + out)[-8192:]  # the usage is in the last events
            if not chunk:
                break
    except _RESETS:
        log.info("client went away mid-stream; closing the upstream request")
        return resp
    except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError, SwitchyardError) as exc:
        return await _failed(resp, target, exc)
    _mark_sent(request, resp, tail)
    with contextlib.suppress(*_RESETS):
        await _end_properly(resp, tail)
        await resp.write_eof()
    return resp


async def _failed(resp: web.StreamResponse, target: Target, exc: BaseException) -> web.StreamResponse:
    """End a stream whose upstream broke (or refused) mid-way with an error event naming the target."""
    if not isinstance(exc, SwitchyardError):
        await asyncio.sleep(0.05)  # let a local lane see its engine's exit, so the error names it
    err = exc if isinstance(exc, SwitchyardError) else target.broken(exc)
    tracing.fail_current(err.message)
    with contextlib.suppress(*_RESETS):
        await resp.write(f"data: {json.dumps(err.envelope())}\n\n".encode() + _DONE)
    return resp


# ---- the protocol-level relay (local engines) --------------------------------------------------------
HIGH_WATER = 256 * 1024  # client bytes buffered before the engine's socket is paused
LOW_WATER = 64 * 1024


class _PumpBase(asyncio.Protocol, abc.ABC):
    """Writes to the client's transport from the engine socket's callback: the first-byte stamp, the
    backpressure (the engine's socket paused while the client is behind), and the end of the stream as one
    future (`finished`) the handler awaits, instead of a wake-up per event. Handed the engine's connection
    (`RawUpstream.hand_over`), it is that connection's protocol: each read is one call, here."""

    def __init__(self, request: web.Request, proto: RawUpstream, client: asyncio.Transport) -> None:
        self.request, self.proto, self.client = request, proto, client
        self.progress = proto.progress
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.first = True
        self._paused = False
        self._drainer: asyncio.Future[None] | None = None

    @property
    @abc.abstractmethod
    def body_ended(self) -> bool:
        """Whether the engine's answer is whole (then its connection may end)."""

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.proto.connection_lost(exc)  # resolves its `done`, whose callback (`lost`) judges the end

    def _write(self, out: bytes, *, content: bool = True) -> bool:
        """Write `out` to the client; False (and the stream ended) when the client is gone. `content`: the
        answer's bytes (the first of them is its first byte for /metrics), not an opening written alone."""
        if self.client.is_closing():
            self._end(ConnectionResetError("the client went away"))
            return False
        self.client.write(out)
        if self.first and content:
            self._first_byte()
        if not self._paused and self.client.get_write_buffer_size() > HIGH_WATER:
            self._pause()
        return True

    def _first_byte(self) -> None:
        self.first = False
        self.request[FIRST_BYTE] = time.perf_counter()

    def _pause(self) -> None:
        self._paused = True
        self.proto.pause()
        self._drainer = asyncio.ensure_future(self._resume_when_drained())

    def lost(self, fut: asyncio.Future[BaseException | None]) -> None:
        """The engine's connection ended: cleanly only if the body had ended."""
        if not self.body_ended:
            exc = fut.result() if not fut.cancelled() else None
            self._end(exc or ConnectionError("the engine closed the stream before its end"))

    def _end(self, exc: BaseException | None) -> None:
        if self.finished.done():
            return
        if exc is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(exc)
        self.proto.close()

    async def _resume_when_drained(self) -> None:
        # a transport tells only its protocol (aiohttp's, not ours) when it drains: look, only while paused
        while not self.client.is_closing() and self.client.get_write_buffer_size() > LOW_WATER:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        self._paused = False
        self.proto.resume()


class _Pump(_PumpBase):
    """The engine's chunk frames, passed to the client untouched (all but the terminal one)."""

    def __init__(
        self, request: web.Request, resp: web.StreamResponse, proto: RawUpstream, client: asyncio.Transport
    ) -> None:
        super().__init__(request, proto, client)
        self.resp = resp
        self.frames = ChunkFrames()
        self.prev = self.last = b""
        self.between = True  # between two frames, nothing held: a read may be exactly one whole frame

    @property
    def body_ended(self) -> bool:
        return self.frames.ended

    def data_received(self, data: bytes) -> None:
        # The common read, one whole event frame, is checked, written and watched for the terminal event
        # here, inline: this runs once per event beside an engine that leaves the caches cold, where each
        # further call and lookup costs several times its in-process price (docs/performance.md, "Fifth
        # pass"). The checks are _one_frame's and _write's; any other read takes the framed walk.
        if (progress := self.progress) is not None:  # the engine is alive (a stalled request's watchdog)
            progress.at = _monotonic()
        if self.between and data.endswith(b"\r\n"):
            eol = data.find(b"\r\n")
            if 0 < eol <= 16:  # a size line is a few hex digits (extensions take the walk)
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = 0
                if size > 0 and eol + size + 4 == len(data):  # whole, and not the terminal frame
                    client = self.client
                    if client.is_closing():
                        self._end(ConnectionResetError("the client went away"))
                        return
                    client.write(data)
                    if self.first:
                        self._first_byte()
                    if not self._paused and client.get_write_buffer_size() > HIGH_WATER:
                        self._pause()
                    self.prev, self.last = self.last, data  # the usage is in the last events: keep two
                    if _DONE in data[-48:]:
                        _mark_sent(self.request, self.resp, self.prev + data)  # whole (see _mark_sent)
                    return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Any read, through the framed walk."""
        frames = self.frames
        out = frames.forward(data)
        self.between = frames.between
        if out:
            if not self._write(out):
                return
            self.prev, self.last = self.last, out  # the usage is in the last events: keep two, parse none
            if _DONE in out[-48:]:
                # the answer is whole once its terminal event is out (see _mark_sent)
                _mark_sent(self.request, self.resp, self.prev + self.last)
        if frames.ended:
            self._end(None)


@_stream_span
async def relay_raw(
    request: web.Request, proto: RawUpstream, target: Target, resp: web.StreamResponse | None = None
) -> web.StreamResponse:
    """Relay a local engine's chunked event stream to an HTTP/1.1 client, frame by frame as it arrives.

    `resp`, when given, is prepared already (chunked: the loading comments went out in it)."""
    try:
        _, headers = proto.head.result()
        if resp is None:
            resp = web.StreamResponse(status=200)
            resp.headers["Content-Type"] = headers.get("content-type", "text/event-stream")
            resp.headers["Cache-Control"] = "no-cache"
            resp.headers["X-Accel-Buffering"] = "no"
            resp.enable_chunked_encoding()
            await resp.prepare(request)
        await resp.write(b"")  # the headers go out now: what follows is written under them
        client = request.transport
        if client is None or client.is_closing():
            return resp
        pump = _Pump(request, resp, proto, client)
        proto.done.add_done_callback(pump.lost)
        proto.hand_over(pump)
        try:
            await target.bounded(pump.finished)
        except _RESETS:
            log.info("client went away mid-stream; closing the upstream request")
            return resp
        except (OSError, SwitchyardError) as exc:
            if pump.frames.inside:
                return _cut(resp, target, client, exc)
            return await _failed(resp, target, exc)
        _mark_sent(request, resp, pump.prev + pump.last)
        with contextlib.suppress(*_RESETS):
            await _end_properly(resp, pump.prev + pump.last)
            await resp.write_eof()
        return resp
    finally:
        proto.close()  # an unfinished answer's socket dropped: the engine stops generating


def _cut(
    resp: web.StreamResponse, target: Target, client: asyncio.Transport, exc: BaseException
) -> web.StreamResponse:
    """End a pass-through stream whose engine broke inside a frame: the client holds part of that frame, so
    no event can follow it in the same framing (it would be read as the frame's rest and the client left
    waiting for the end). The connection is closed instead: the client sees a body cut short."""
    err = exc if isinstance(exc, SwitchyardError) else target.broken(exc)
    log.warning("the engine's stream broke inside an event; closing the client's connection: %s", err.message)
    tracing.fail_current(err.message)
    resp.force_close()
    client.close()  # what was written is flushed first
    return resp


def raw_relay_fits(request: web.Request, proto: RawUpstream, resp: web.StreamResponse | None) -> bool:
    """Whether the frames can go through untouched: an HTTP/1.1 client on a chunked response, and a
    chunked event stream from the engine."""
    _, headers = proto.head.result()
    return (
        request.version == aiohttp.HttpVersion11
        and "chunked" in headers.get("transfer-encoding", "").lower()
        and "text/event-stream" in headers.get("content-type", "")
        and (resp is None or resp.chunked)
    )


# ---- a translated stream at the protocol level (local engines) ----------------------------------------
class _TranslatePump(_PumpBase):
    """Decodes the engine's chunk frames, reads the events as deltas, turns them into the surface's own
    bytes (the translation) and writes those to the client as chunk frames at once."""

    def __init__(
        self,
        request: web.Request,
        proto: RawUpstream,
        client: asyncio.Transport,
        tr: Translation,
        *,
        opens: bool = False,
    ) -> None:
        super().__init__(request, proto, client)
        self.tr = tr
        self.frames = ChunkPayload()
        self.reader = StreamReader()
        self.opens = opens  # the opening is ours to write: once the prompt's size is known, or first

    @property
    def body_ended(self) -> bool:
        return self.frames.ended or self.reader.done

    def data_received(self, data: bytes) -> None:
        if (progress := self.progress) is not None:  # the engine is alive (a stalled request's watchdog)
            progress.at = _monotonic()
        self.feed(data)

    def feed(self, data: bytes) -> None:
        payload = self.frames.feed(data)
        if payload and not self.finished.done():
            try:
                deltas = self.reader.deltas(payload)
            except StreamRefusal as exc:
                self._end(exc)
                return
            out = b""
            for delta in deltas:
                out += self.tr.feed(delta)
                if self.tr.stopped:
                    break
            content = bool(out)
            if self.opens and (out or not self.tr.wants_prompt_count()):
                self.opens = False  # the engine's first chunk told the prompt's size, or content came first
                out = self.tr.pending_opening() + out
            if out and not self._write(b"%x\r\n%s\r\n" % (len(out), out), content=content):
                return
        if self.body_ended or self.tr.stopped:
            self._end(None)


@_stream_span
async def translate_raw(
    request: web.Request, proto: RawUpstream, target: Target, tr: Translation, *, opens: bool = False
) -> None:
    """Run a local engine's event stream through `tr` into the prepared, chunked response of `request`;
    `opens`: the opening is not written yet, and goes out before the stream's first bytes (once the
    engine's first chunk told the prompt's size: llama.cpp's `return_progress`).

    Returns once the engine's stream ended (or the translation stopped it); raises the target's refusal
    for an error inside the stream, its broken-connection error if the engine went away, and
    ConnectionResetError when the client did."""
    try:
        client = request.transport
        if client is None or client.is_closing():
            raise ConnectionResetError("the client went away")
        pump = _TranslatePump(request, proto, client, tr, opens=opens)
        proto.done.add_done_callback(pump.lost)
        proto.hand_over(pump)
        try:
            await target.bounded(pump.finished)
        except StreamRefusal as exc:
            raise target.refused(500, exc.payload) from None
        except _RESETS:
            raise
        except OSError as exc:
            await asyncio.sleep(0.05)  # let a local lane see its engine's exit, so the error names it
            raise target.broken(exc) from exc
    finally:
        proto.close()
