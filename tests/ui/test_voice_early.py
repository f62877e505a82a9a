"""Hold-to-talk keeps what is said from the press on, however slow the connection to the server is: a
person presses F9 and speaks at once, and the first words (or, released before the connection is open, all
of them) reach the transcript and the message. The microphone's stand-in hears the speech in real time from
the press and, like a real one, only while its stream is open; the window reaches its own server through a
relay that holds each connection's first bytes, as a loaded machine or a slow link would."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pytest

from tests.support.voice_stack import VOICE, install_voice_models, key, until  # the stack, or a skip

# isort: split
from PySide6.QtCore import QEvent

from app.core.paths import Paths
from app.core.settings import Settings


class Speaker:
    """Someone talking into the microphone from `start` (the press, on the loop's clock): `pcm` (24 kHz),
    then silence. Each 100 ms block exists once it has been said, and only an open stream hears it: the
    blocks said before `chunks()` began are lost, as with a real microphone opened late."""

    def __init__(self, pcm: np.ndarray, *, start: float, rate: int, block_s: float) -> None:
        self.pcm, self.start, self.block_s = pcm, start, block_s
        self.step = int(rate * block_s)
        self.stopped = False
        self.opened_at: float | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        self.opened_at = loop.time() - self.start
        k = int(self.opened_at / self.block_s)  # the first block still being said
        while not self.stopped:
            await asyncio.sleep(max(0.0, self.start + (k + 1) * self.block_s - loop.time()))
            if self.stopped:
                return
            block = self.pcm[k * self.step : (k + 1) * self.step]
            yield np.pad(block, (0, self.step - block.size)).astype("<i2").tobytes()
            k += 1

    def stop(self) -> None:
        self.stopped = True


@contextlib.asynccontextmanager
async def held_link(url: str, *, hold: float) -> AsyncIterator[str]:
    """A TCP relay to `url`'s host that forwards each connection's first bytes from the client (the
    WebSocket upgrade) only after `hold` seconds; yields the relay's base URL."""
    target = urlsplit(url)
    assert target.hostname and target.port
    conns: list[asyncio.Future[Any]] = []

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, wait: float) -> None:
        try:
            while data := await src.read(1 << 16):
                if wait:
                    await asyncio.sleep(wait)
                    wait = 0
                dst.write(data)
                await dst.drain()
        except OSError:  # one side went away: this direction is over
            pass
        finally:
            dst.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        both = asyncio.gather(copy(reader, up_writer, wait=hold), copy(up_reader, writer, wait=0))
        conns.append(both)
        await both

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for c in conns:
            c.cancel()
        await asyncio.gather(*conns, return_exceptions=True)


def test_speech_from_the_press_reaches_the_message_however_slow_the_connection(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.ui import voice
    from app.ui.desktop import Desktop

    models = tmp_path / "models"
    install_voice_models(models)
    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            page: Any = desk.window.show_page("Chat")
            bar = page.voice

            async def say(text: str) -> np.ndarray:
                body = {"model": VOICE, "input": text, "voice": "x", "response_format": "wav"}
                async with (
                    aiohttp.ClientSession() as http,
                    http.post(f"{desk.server.url}/v1/audio/speech", json=body) as r,
                ):
                    assert r.status == 200, await r.text()
                    with wave.open(io.BytesIO(await r.read())) as w:
                        rate = w.getframerate()
                        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
                n = round(pcm.size * voice.RATE / rate)
                return np.interp(np.arange(n) * rate / voice.RATE, np.arange(pcm.size), pcm).astype("<i2")

            hello, test = await say("Hello world."), await say("This is a test.")
            hold = 0.0
            real_access = voice.window_access

            async def slow_access(d: Any) -> Any:
                access = await real_access(d)
                relay = await links.enter_async_context(held_link(access.url, hold=hold))
                return dataclasses.replace(access, url=relay)

            monkeypatch.setattr(voice, "window_access", slow_access)

            async def talk(pcm: np.ndarray, *, link_s: float, release_after: float) -> list[str]:
                nonlocal hold
                hold = link_s
                before = [m.content for m in page.store.messages(page.current or 0) if m.role == "user"]
                start = asyncio.get_running_loop().time()
                speaker = Speaker(pcm, start=start, rate=voice.RATE, block_s=voice.CHUNK_S)
                bar.source_factory = lambda: speaker
                key(page.input, QEvent.Type.KeyPress)  # F9 pressed, and the person speaks at once
                assert bar.talk_task is not None and bar.missing.text() == ""
                await asyncio.sleep(release_after)
                key(page.input, QEvent.Type.KeyRelease)
                await until(
                    lambda: bar.talk_task is None,
                    limit=90,
                    state=lambda: (bar.live.text(), page.status.text()),
                )
                users = [m.content for m in page.store.messages(page.current or 0) if m.role == "user"]
                # the microphone opened at the press, not once the connection was open
                opened.append(speaker.opened_at)
                return users[len(before) :]

            opened: list[float | None] = []  # when each talk's microphone opened, from its press
            lead = np.zeros(voice.RATE // 5, dtype="<i2")
            async with contextlib.AsyncExitStack() as links:
                # --- released before the connection is open: everything said is sent once it opens
                said = np.concatenate([lead, hello])
                speech_s = said.size / voice.RATE
                sent = await talk(said, link_s=speech_s + 2.5, release_after=speech_s + 0.3)
                assert len(sent) == 1 and "hello" in sent[0].lower() and "world" in sent[0].lower(), (
                    sent,
                    page.status.text(),
                )
                # --- speech that goes on after the connection opens: the part said while it opened and
                # the part said after it are both in the message, once each
                gap = np.zeros(voice.RATE * 3 // 4, dtype="<i2")
                said = np.concatenate([lead, hello, gap, test])
                sent = await talk(said, link_s=1.0, release_after=said.size / voice.RATE + 0.3)
                assert len(sent) == 1, (sent, page.status.text())
                heard = sent[0].lower()
                assert "hello" in heard and "test" in heard and heard.count("hello") == 1, heard
            assert all(at is not None and at < 1.0 for at in opened), opened

    qloop.run_until_complete(asyncio.wait_for(scenario(), 240))
