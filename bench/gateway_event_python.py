"""The Python the gateway runs per streamed event, in-process and without sockets: what the byte relay and
the translated relay add to the floor's one wake-up and one write.

Feeds llama.cpp's own chunk frame for one text token (as its server writes it) through the pieces each
pump runs in the engine socket's callback, 20,000 times, and prints CPU µs per event (process time, best
of 5 rounds, with the load average beside it):

- pass-through: `ChunkFrames.forward` (the frame tracking of gateway/relay.py `_Pump`'s walk), and all of
  the engine socket's callback (`_Pump.data_received`, the pump being the connection's own protocol: the
  frame check, the progress stamp, the write to a transport whose methods are C callables, as uvloop's);
- translated (Anthropic): `ChunkPayload.feed` (de-chunking), `StreamReader.deltas` (the delta), the
  translation (tool-call recovery, the Anthropic translator, the event's JSON) and the outgoing frame,
  in answers of 256 events (a new reader and translator for each, as per request), and again in answers
  of 10,000 events (a cost per piece that grows with the answer shows there).

    .venv/bin/python bench/gateway_event_python.py
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.chat.deltas import StreamReader
from app.lanes.target import Progress
from app.server.gateway.raw_http import ChunkFrames, ChunkPayload, RawUpstream
from app.server.gateway.relay import _Pump
from app.server.gateway.tool_recovery import RecoveringRun
from app.server.surfaces.anthropic.translate import MessageTranslator
from app.server.surfaces.registry import SURFACES
from app.server.surfaces.translation import TranslatedRun

CHUNK = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"p"}}],"created":1796491802,'
    b'"id":"chatcmpl-JoUcOqgOrQRbQNs6QNcCu2gVyEgdyIGs","model":"medium","system_fingerprint":"b0-unknown",'
    b'"object":"chat.completion.chunk"}\n\n'
)
FRAME = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
N = 20_000
ANSWER_EVENTS = 256  # events per answer: the translator is built anew for each, as per request
LONG_ANSWER_EVENTS = 10_000  # a long answer: what a piece costs must not grow with the answer


def per_event(step: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(N):
            step()
        best = min(best, (time.process_time() - t0) / N * 1e6)
    return best


class _Socket:
    """A transport of C callables (a uvloop transport's methods are C): only the Python of the pump counts."""

    def __init__(self) -> None:
        self.is_closing = bool  # () -> False
        self.write = collections.deque(maxlen=1).append
        self.get_write_buffer_size = int  # () -> 0
        self.protocol: Any = None

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol


def pump_callback() -> Callable[[bytes], None]:
    """The callback an engine socket's read runs on the pass-through: the pump, handed the connection."""

    async def build() -> Callable[[bytes], None]:  # a pump is made on a running loop (its end's future)
        proto = RawUpstream(asyncio.get_running_loop(), progress=Progress())
        socket = _Socket()
        proto.transport = cast(asyncio.Transport, socket)
        pump = _Pump(cast(Any, {}), cast(Any, None), proto, cast(asyncio.Transport, _Socket()))
        proto.hand_over(pump)
        return cast(Callable[[bytes], None], socket.protocol.data_received)

    return asyncio.new_event_loop().run_until_complete(build())


def main() -> None:
    frames = ChunkFrames()
    callback = pump_callback()
    payload = ChunkPayload()
    encoding = next(s for s in SURFACES if s.name == "anthropic").encoding
    answer: list[object] = []

    def translated(events: int) -> Callable[[], None]:
        def step() -> None:
            if len(answer) % events == 0:  # a new answer: what a request builds, once per stream
                answer[:] = [ChunkPayload(), StreamReader()]
                tr = RecoveringRun(TranslatedRun(MessageTranslator(model="m"), encoding=encoding), model="m")
                tr.opening()
                answer.append(tr)
            chunks, reader, tr = answer[:3]
            out = b""
            for delta in reader.deltas(chunks.feed(FRAME)):  # type: ignore[attr-defined]
                out += tr.feed(delta)  # type: ignore[attr-defined]
            _ = b"%x\r\n%s\r\n" % (len(out), out)
            answer.append(None)

        return step

    passed = per_event(lambda: frames.forward(FRAME))
    pumped = per_event(lambda: callback(FRAME))
    dechunk = per_event(lambda: payload.feed(FRAME))
    deltas = per_event(lambda: StreamReader().deltas(CHUNK))
    whole = per_event(translated(ANSWER_EVENTS))
    answer.clear()
    long = per_event(translated(LONG_ANSWER_EVENTS))
    print(f"load average {os.getloadavg()[0]:.2f}; CPU µs per event, best of 5 rounds of {N}:")
    print(f"  pass-through frame tracking   {passed:6.2f}")
    print(f"  pass-through socket callback  {pumped:6.2f} (all of it: check, stamp, write, watch)")
    print(f"  translated, all of it         {whole:6.2f}")
    ratio = long / whole
    print(f"      in answers of {LONG_ANSWER_EVENTS} events {long:6.2f} ({ratio:.2f}x the short answers')")
    print(f"    of which de-chunking        {dechunk:6.2f}")
    print(f"    of which the delta reader   {deltas:6.2f} (a fresh reader each time)")


if __name__ == "__main__":
    main()
