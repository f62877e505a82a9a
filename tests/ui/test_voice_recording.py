"""Hold-to-talk's recording, without a server: it records from the moment it is made, whether or not anyone
reads it yet, and ends at the release with every block captured before it; a source that does not end when
stopped is cut off. The microphone source (over a PortAudio stand-in whose callback runs on its own thread,
as PortAudio's does) never opens the device when stopped before it started, hands over the block captured
while it stopped, and closes the device however its reader leaves."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

pytest.importorskip("PySide6")

from app.ui import voice
from app.ui.voice import MicSource, Recording


class Counting:
    """Block n is b"n", one every `every` seconds; ignores stop() when `deaf`."""

    def __init__(self, *, every: float = 0.01, deaf: bool = False) -> None:
        self.every, self.deaf = every, deaf
        self.stopped = False
        self.made = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self.stopped or self.deaf:
            await asyncio.sleep(self.every)
            self.made += 1
            yield str(self.made).encode()

    def stop(self) -> None:
        self.stopped = True


async def drain(rec: Recording) -> list[bytes]:
    out = []
    while (block := await rec.next_block()) is not None:
        out.append(block)
    return out


def test_records_before_anyone_reads_and_ends_at_the_release() -> None:
    async def main() -> None:
        released = asyncio.Event()
        source = Counting()
        rec = Recording(source, released=released)
        await asyncio.sleep(0.3)  # the connection is still opening: nobody reads yet
        released.set()
        got = await asyncio.wait_for(drain(rec), 5)
        assert len(got) >= 3, got  # what was said while nobody read is all there, in order
        assert got == [str(i + 1).encode() for i in range(len(got))]
        assert source.stopped and len(got) == source.made
        assert await rec.next_block() is None  # over, and it stays over
        await rec.close()

    asyncio.run(main())


def test_a_source_that_does_not_stop_is_cut_off() -> None:
    async def main() -> None:
        released = asyncio.Event()
        rec = Recording(Counting(deaf=True), released=released)
        released.set()
        t0 = time.monotonic()
        await asyncio.wait_for(drain(rec), 5)
        assert time.monotonic() - t0 < voice.STOP_GRACE_S + 1

    asyncio.run(main())


def test_a_failing_source_says_why() -> None:
    class Broken:
        async def chunks(self) -> AsyncIterator[bytes]:
            yield b"1"
            raise OSError("the device went away")

        def stop(self) -> None:
            pass

    async def main() -> None:
        rec = Recording(Broken(), released=asyncio.Event())
        assert await rec.next_block() == b"1"
        with pytest.raises(OSError, match="went away"):
            await rec.next_block()
        await rec.close()

    asyncio.run(main())


class FakeStream:
    """PortAudio's RawInputStream as far as MicSource uses it: the callback on a thread of its own, one block
    per period; stop() returns once the callback is over, having delivered the block in progress."""

    opened: ClassVar[list[FakeStream]] = []

    def __init__(self, *, samplerate: int, channels: int, dtype: str, blocksize: int, callback: Any) -> None:
        self.blocksize, self.callback = blocksize, callback
        self.running = threading.Event()
        self.closed = False
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        FakeStream.opened.append(self)

    def _run(self) -> None:
        while self.running.is_set():
            time.sleep(0.01)
            self.sent += 1
            self.callback(bytes([self.sent % 256]) * 2 * self.blocksize, self.blocksize, None, None)

    def start(self) -> None:
        self.running.set()
        self._thread.start()

    def stop(self) -> None:
        self.running.clear()
        self._thread.join()

    def close(self) -> None:
        self.closed = True


class FakeSd:
    RawInputStream = FakeStream


def test_microphone_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(voice, "_sd", lambda: FakeSd)

    async def main() -> None:
        # stopped before its reading began: the device is never opened
        FakeStream.opened.clear()
        early = MicSource()
        early.stop()
        assert [b async for b in early.chunks()] == []
        assert FakeStream.opened == []
        # a talk: every block the device captured, the last one included, comes before the end
        mic = MicSource()
        released = asyncio.Event()
        rec = Recording(mic, released=released)
        await asyncio.sleep(0.2)
        released.set()
        got = await asyncio.wait_for(drain(rec), 5)
        (stream,) = FakeStream.opened
        assert len(got) == stream.sent > 2 and stream.closed
        # a reader that leaves mid-talk (the connection failed): the device is closed all the same
        mic = MicSource()
        rec = Recording(mic, released=asyncio.Event())
        await asyncio.sleep(0.1)
        await rec.close()
        assert FakeStream.opened[-1].closed and not FakeStream.opened[-1].running.is_set()

    asyncio.run(main())
