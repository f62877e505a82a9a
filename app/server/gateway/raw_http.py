"""A minimal HTTP/1.1 client for one streamed POST to a local engine, at the protocol level.

The pass-through relay (gateway/relay.py) needs the engine's answer as bytes the moment they arrive,
written to the client's transport from the upstream socket's callback: no stream reader, no future and no
task wake-up per event. aiohttp's client offers no such hook, so this does the little HTTP that a stream
from a local engine needs: one request with `Connection: close`, a status line and headers, then the body
handed to a sink as it comes. Only plain-HTTP loopback targets use it; remotes go through aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, cast
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
Sink = Callable[[bytes], None]


class Progress(Protocol):
    """Where the time of the engine's last byte is marked (a lane's, app/lanes/lane.py)."""

    at: float


class UpstreamClosed(ConnectionError):
    """The engine closed the connection before it answered (or died)."""


class RawUpstream(asyncio.Protocol):
    """One connection, one request, one answer. `head` resolves to (status, headers); body bytes go to the
    sink attached with `attach` (what arrived before it is replayed); `done` resolves when the connection
    ends, to None or the error that ended it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, progress: Progress | None = None) -> None:
        self.progress = progress
        self.head: asyncio.Future[tuple[int, dict[str, str]]] = loop.create_future()
        self.done: asyncio.Future[BaseException | None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._sink: Sink | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        if self.progress is not None:  # the engine is alive: what a stalled request's watchdog asks
            self.progress.at = time.monotonic()
        if self._sink is not None:
            self._sink(data)
            return
        self._buf += data
        if self.head.done():
            return  # body bytes before a sink is attached: kept for `attach`
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > HEAD_LIMIT:
                self._fail(UpstreamClosed("the engine sent an answer head over 64 KiB"))
            return
        head, self._buf = self._buf[:end], self._buf[end + 4 :]
        try:
            self.head.set_result(_parse_head(head))
        except ValueError as exc:
            self._fail(UpstreamClosed(f"the engine's answer is not HTTP ({exc})"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(
                exc or UpstreamClosed("the engine closed the connection without answering")
            )
        if not self.done.done():
            self.done.set_result(exc)

    # ---- use -------------------------------------------------------------------------------------------
    def attach(self, sink: Sink) -> None:
        """Send the body to `sink` from now on (and what already arrived, at once)."""
        self._sink = sink
        if self._buf:
            pending, self._buf = self._buf, b""
            sink(pending)

    def hand_over(self, protocol: asyncio.Protocol) -> None:
        """Make `protocol` the connection's own, so the engine's reads reach it with no call in between
        (what already arrived is replayed through its `data_received` first). It stamps `progress` itself,
        and its `connection_lost` must call this one's: that resolves `done`."""
        if self._buf:
            pending, self._buf = self._buf, b""
            protocol.data_received(pending)
        if self.transport is not None:
            self.transport.set_protocol(protocol)

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        """Drop the connection: an engine stops generating for a request whose socket is gone."""
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"status line {lines[0][:80]!r}")
    status = int(rest.split(" ", 1)[0])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def open_post(
    url: str, path: str, body: bytes, headers: dict[str, str], *, progress: Progress | None = None
) -> RawUpstream:
    """Connect to `url`'s host, send the POST, and return the protocol once the answer's head arrived
    (`progress`: marked at each byte received).

    Raises OSError (or TimeoutError) when nothing answers there, UpstreamClosed when the connection ends
    before a head."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        _, proto = await loop.create_connection(lambda: RawUpstream(loop, progress=progress), host, port)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    lines += [
        f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("content-length", "connection", "host")
    ]
    assert proto.transport is not None
    proto.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    try:
        await proto.head
    except BaseException:
        proto.close()
        raise
    return proto


def size_line(data: bytes, pos: int) -> tuple[int, int] | None:
    """The chunk size announced at `pos` and where its data begins; None when the line is not whole yet."""
    eol = data.find(b"\r\n", pos)
    if eol < 0:
        return None
    return int(data[pos:eol].split(b";", 1)[0] or b"0", 16), eol + 2


def _one_frame(data: bytes) -> int | None:
    """The data size of `data` when it is exactly one whole chunk frame (size line, data, CRLF), else None.
    An engine writes each event as one frame and the kernel mostly hands it over in one read."""
    eol = data.find(b"\r\n")
    if eol < 0 or eol > 16 or not data.endswith(b"\r\n"):
        return None  # a size line is a few hex digits (extensions take the general path)
    try:
        size = int(data[:eol], 16)
    except ValueError:
        return None
    return size if size > 0 and eol + 2 + size + 2 == len(data) else None  # not the terminal frame


class ChunkFrames:
    """Tracks HTTP/1.1 chunked framing over a byte stream passed on as it is: says which bytes to forward
    (every frame but the terminal zero-length one, which the client's own response writes) and when the
    body ended. Frames are forwarded whole or in pieces, never re-encoded."""

    __slots__ = ("_left", "_line", "ended")

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data and its CRLF still to come
        self._line = b""  # a size line cut by a read boundary
        self.ended = False

    @property
    def inside(self) -> bool:
        """Whether the bytes passed on end inside a frame: its data, or the CRLF after it, still to come."""
        return self._left > 0

    @property
    def between(self) -> bool:
        """Whether the stream stands between two frames, nothing held: the next read may be a whole one."""
        return not self._left and not self._line and not self.ended

    def forward(self, data: bytes) -> bytes:
        """The part of `data` to pass on (held bytes of a cut size line included)."""
        if self.ended:
            return b""  # nothing after the terminal frame is the client's
        if self._line:
            data, self._line = self._line + data, b""
        elif not self._left and _one_frame(data) is not None:
            return data  # the common read: one whole event frame, passed on without a walk
        pos, n = 0, len(data)
        while pos < n and not self.ended:
            if self._left:
                step = min(self._left, n - pos)
                pos += step
                self._left -= step
                continue
            line = size_line(data, pos)
            if line is None:
                self._line = data[pos:]  # finished by the next read
                return data[:pos]
            size, after = line
            if size == 0:
                self.ended = True
                return data[:pos]
            self._left = size + 2
            pos = after
        return data


def dechunk(data: bytes) -> bytes:
    """The body of a chunked answer read whole (an error answer, not a stream)."""
    return ChunkPayload().feed(data)


async def read_all(proto: RawUpstream) -> bytes:
    """The rest of the answer once the engine closes the connection (it was asked to), de-chunked."""
    parts: list[bytes] = []
    proto.attach(parts.append)
    await proto.done
    data = b"".join(parts)
    _, headers = proto.head.result()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return dechunk(data)
    length = headers.get("content-length")
    return data[: int(length)] if length and length.isdigit() else data


class ChunkPayload:
    """Decodes HTTP/1.1 chunked framing incrementally: the data bytes of the frames, as they arrive."""

    __slots__ = ("_buf", "_left", "ended")

    def __init__(self) -> None:
        self._buf = b""  # a size line cut by a read boundary
        self._left = 0  # data bytes of the current chunk still to come (its CRLF counted apart)
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        if self.ended:
            return b""
        if self._buf:
            data, self._buf = self._buf + data, b""
        elif not self._left and (size := _one_frame(data)) is not None:
            return data[len(data) - size - 2 : -2]  # the common read: one whole frame, its data sliced once
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            if self._left > 2:  # data bytes, then the CRLF
                take = min(self._left - 2, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                continue
            if self._left:  # the CRLF after the data
                step = min(self._left, n - pos)
                pos += step
                self._left -= step
                continue
            line = size_line(data, pos)
            if line is None:
                self._buf = data[pos:]
                break
            size, after = line
            if size == 0:
                self.ended = True
                break
            self._left = size + 2
            pos = after
        return b"".join(out)
