"""The byte relay, once it is the engine connection's own protocol (issue 35, fifth pass).

A read that is exactly one whole event frame takes the short way (checked, written and watched for the
terminal event in the one callback); any other read takes the framed walk. These tests cut the engine's
frames at chosen places over a real loopback socket, which a real engine's timing cannot be made to do,
and read the relayed stream with a real aiohttp client: the same bytes, the same end, the same marks
(first byte, the answer recorded with its usage, the engine's progress) whichever way each read went.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.core.errors import EngineCrashedError, SwitchyardError
from app.lanes.target import Progress
from app.server.gateway.raw_http import open_post
from app.server.gateway.relay import relay_raw
from app.server.metrics import FIRST_BYTE, SENT_STATUS, USAGE

T = TypeVar("T")
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"


def frame(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


USAGE_EVENT = (
    b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}).encode()
)
USAGE_EVENT += b"\n\n"


@dataclass
class LocalTarget:
    """What relay_raw asks of a target: its names, its bound on a wait, and its broken-connection error.
    Only the engine here is a socket whose writes this test places; the relay itself is the real one."""

    model_id: str = "m"
    engine: str = "llamacpp"
    progress: Progress = field(default_factory=Progress)

    async def bounded(self, aw: Awaitable[T]) -> T:
        return await aw

    def broken(self, exc: BaseException | None = None) -> SwitchyardError:
        return EngineCrashedError(f"the engine for 'm' broke: {exc}")


@dataclass
class Engine:
    """A loopback socket that answers one request with the pieces given, each its own write (a short
    pause between, so each is mostly its own read on the other side); `gone` is set when our side of the
    connection is closed by the relay."""

    pieces: list[bytes]
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    pause_s: float = 0.02
    breaks: bool = False  # the engine dies after its pieces (its connection closed from its side)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            writer.write(HEAD)
            for piece in self.pieces:
                await asyncio.sleep(self.pause_s)
                writer.write(piece)
                await writer.drain()
            if not self.breaks:
                await reader.read()  # until the relay closes the connection
        except ConnectionError:
            pass
        finally:
            self.gone.set()
            writer.close()


@pytest.fixture
async def relayed() -> AsyncIterator[Any]:
    """A function: the engine's pieces in, (the client's body, the request's marks, the target) out."""
    servers: list[Any] = []

    async def run(engine: Engine, *, read: bool = True) -> tuple[bytes, dict[str, Any], LocalTarget]:
        upstream = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
        servers.append(upstream)
        port = upstream.sockets[0].getsockname()[1]
        target = LocalTarget()
        marks: dict[str, Any] = {}

        async def handler(request: web.Request) -> web.StreamResponse:
            proto = await open_post(
                f"http://127.0.0.1:{port}", "/v1/chat/completions", b"{}", {}, progress=target.progress
            )
            try:
                return await relay_raw(request, proto, target)  # type: ignore[arg-type]
            finally:
                marks.update(
                    first=request.get(FIRST_BYTE), sent=request.get(SENT_STATUS), usage=request.get(USAGE)
                )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        body = b""
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url("/v1/chat/completions"), json={}) as resp:
                assert resp.status == 200
                if read:
                    body = await resp.read()
                else:
                    await resp.content.readany()  # the first event, then the client hangs up
        await asyncio.wait_for(engine.gone.wait(), 5)
        await asyncio.sleep(0.05)  # the handler's end (its marks) runs after the client's read
        return body, marks, target

    yield run
    for s in servers:
        if isinstance(s, TestServer):
            await s.close()
        else:
            s.close()


async def test_whole_cut_and_joined_frames_reach_the_client_as_the_engine_sent_them(relayed: Any) -> None:
    events = [event(f"piece {i} ") for i in range(6)] + [USAGE_EVENT, DONE]
    frames = [frame(e) for e in events]
    cut_data, cut_line = frames[1], frames[2]
    pieces = [
        frames[0],  # one whole frame: the short way
        cut_data[:9],  # a frame cut inside its data: the walk, twice
        cut_data[9:],
        cut_line[:1],  # a frame cut inside its size line
        cut_line[1:],
        frames[3] + frames[4],  # two frames in one read
        frames[5],  # whole again, after the walk
        frames[6],
        frames[7],
        b"0\r\n\r\n",  # the terminal frame: the client's own response writes it
    ]
    started = time.monotonic()
    body, marks, target = await relayed(Engine(pieces))
    assert body == b"".join(events)
    assert marks["sent"] == 200  # recorded as answered in full, at its terminal event
    assert marks["usage"] == (7, 5)  # read from the last events
    assert marks["first"] is not None
    assert target.progress.at > started + 0.15  # marked at its reads, the last ones included


async def test_a_stream_that_ends_without_its_terminal_event_gets_one(relayed: Any) -> None:
    events = [event("only "), event("two")]
    body, marks, _ = await relayed(Engine([frame(e) for e in events] + [b"0\r\n\r\n"]))
    assert body == b"".join(events) + DONE
    assert marks["sent"] == 200


async def test_an_engine_that_breaks_between_frames_ends_the_stream_with_an_error_event(relayed: Any) -> None:
    events = [event("half ")]
    body, marks, _ = await relayed(Engine([frame(e) for e in events] + [b"40"], breaks=True))
    text = body.decode()
    assert text.startswith(events[0].decode() + "data: ")  # a size line cut short is never passed on
    error = json.loads(text[len(events[0]) + len("data: ") : -len(DONE)])
    assert error["error"]["code"] == "engine_crashed"
    assert "the engine for 'm' broke" in error["error"]["message"]
    assert text.endswith(DONE.decode())
    assert marks["sent"] is None  # not an answer in full


async def test_an_engine_that_breaks_inside_a_frame_cuts_the_clients_body_short(relayed: Any) -> None:
    # the client already holds part of the frame: an error event after it would be read as that frame's
    # rest, and the client left waiting for the end of a body that never comes
    cut = b'40\r\ndata: {"cho'
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(relayed(Engine([frame(event("half ")), cut], breaks=True)), 10)


async def test_a_client_that_leaves_closes_the_engine_connection(relayed: Any) -> None:
    pieces = [frame(event(f"piece {i} ")) for i in range(200)]
    engine = Engine(pieces, pause_s=0.01)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    _, marks, _ = await relayed(engine, read=False)
    assert engine.gone.is_set() and loop.time() - t0 < 1.5  # long before its 200 pieces (2 s) were out
    assert marks["sent"] is None
