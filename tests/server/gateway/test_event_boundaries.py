"""The aiohttp relay (remote engines, HTTP/1.0 clients, rewritten streams) passes whole events only, so an
error event after an engine broke mid-event starts its own line. It was glued to the half event the client
already had (`data: {"choices": [{"del` + `data: {"error": ...}`), which no SSE client could read: the
error was lost in a JSON error of the client's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.core.errors import EngineCrashedError, SwitchyardError
from app.server.gateway.relay import relay, whole_events

T = TypeVar("T")
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
HALF = b'data: {"choices":[{"index":1,"del'


def test_whole_events_cuts_after_the_last_blank_line() -> None:
    assert whole_events(b"", EVENT) == (EVENT, b"")
    assert whole_events(b"", EVENT + HALF) == (EVENT, HALF)
    assert whole_events(HALF, b'ta":{}}]}\n\n') == (HALF + b'ta":{}}]}\n\n', b"")
    assert whole_events(b"", HALF) == (b"", HALF)
    crlf = b"data: {}\r\n\r\n"
    assert whole_events(b"", crlf + b"data: x") == (crlf, b"data: x")
    assert whole_events(b"", b": loading\n\n") == (b": loading\n\n", b"")


@dataclass
class RemoteTarget:
    model_id: str = "m"
    engine: str = "remote"

    async def bounded(self, aw: Awaitable[T]) -> T:
        return await aw

    def broken(self, exc: BaseException | None = None) -> SwitchyardError:
        return EngineCrashedError(f"the engine for 'm' broke: {exc}")


async def _relayed(pieces: list[bytes], *, breaks: bool) -> bytes:
    """The client's body when an upstream sends `pieces` (each its own chunk and write) through `relay`,
    then ends its answer or, with `breaks`, drops the connection without its terminal chunk."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        if not breaks:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]

    async def handler(request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession() as http:
            answer = await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={})
            return await relay(request, answer, RemoteTarget())  # type: ignore[arg-type]

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url("/v1/chat/completions"), json={}) as resp:
                return await resp.read()
    finally:
        await server.close()
        upstream.close()


def _events(body: bytes) -> list[Any]:
    """Every event's data as a client reads it: JSON, or the [DONE] marker; any other line fails."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_an_engine_that_breaks_inside_an_event_gives_a_readable_error_event() -> None:
    body = await _relayed([EVENT, HALF], breaks=True)
    events = _events(body)
    assert events[0]["choices"][0]["delta"] == {"content": "hi"}
    assert "broke" in events[1]["error"]["message"] and events[2] == "[DONE]"
    assert HALF not in body  # the half event never reached the client


async def test_events_cut_across_reads_arrive_whole_and_in_order() -> None:
    second = b'data: {"choices":[{"index":0,"delta":{"content":"there"}}]}\n\n'
    body = await _relayed([EVENT + second[:20], second[20:], b"data: [DONE]\n\n"], breaks=False)
    assert body == EVENT + second + b"data: [DONE]\n\n"
    assert [e if e == "[DONE]" else e["choices"][0]["delta"]["content"] for e in _events(body)] == [
        "hi",
        "there",
        "[DONE]",
    ]
