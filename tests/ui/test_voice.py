"""The chat page talks and listens, offscreen on the real Runtime and its in-process server: what is missing
is said first; then hold-to-talk (the F9 shortcut) with a recorded WAV of Piper's speech in place of the
microphone shows the live transcript from the whisper.cpp lane and sends it; "read aloud" speaks a reply
with the Piper voice, sentence by sentence, into a sink standing in for the speakers, and Stop ends it."""

from __future__ import annotations

import asyncio
import io
import wave
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from tests.support.voice_stack import VOICE, install_voice_models, key, until  # the stack, or a skip

# isort: split
from PySide6.QtCore import QEvent

from app.core.paths import Paths
from app.core.settings import Settings


class Sink:
    """The speakers' stand-in: what was played, at which rate."""

    def __init__(self, *, slow: bool = False) -> None:
        self.played: list[tuple[int, int, int]] = []  # rate, samples, peak
        self.stopped = 0
        self.slow = slow

    async def play(self, pcm: bytes, *, rate: int) -> None:
        samples = np.frombuffer(pcm, dtype="<i2")
        self.played.append((rate, samples.size, int(np.abs(samples).max())))
        if self.slow:
            await asyncio.sleep(samples.size / rate)  # as long as real playback

    def stop(self) -> None:
        self.stopped += 1


def test_hold_to_talk_and_read_aloud(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop
    from app.ui.voice import WavSource

    models = tmp_path / "models"
    models.mkdir()
    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            page = desk.window.show_page("Chat")
            bar = page.voice
            # --- nothing installed: each control says what is missing and offers the download
            bar.press()
            assert "No whisper model" in bar.missing.text() and not bar.get_btn.isHidden()
            assert bar.talk_task is None
            bar.read_aloud()
            assert "No Piper voice" in bar.missing.text()
            bar._discover()
            assert desk.window.show_page("Discover").query.text() == "piper voice"
            desk.window.show_page("Chat")
            # --- install a voice and a whisper model; without a microphone that is said too
            install_voice_models(models)
            await asyncio.to_thread(desk.runtime.catalog.scan)
            bar.press()
            assert bar.talk_task is None and (
                "sounddevice" in bar.missing.text() or "microphone" in bar.missing.text().lower()
            )
            bar.read_aloud()
            assert "sounddevice" in bar.missing.text() or "speaker" in bar.missing.text().lower()
            # --- a recording of Piper's speech stands in for the microphone
            url = desk.server.url
            async with aiohttp.ClientSession() as http:
                body = {"model": VOICE, "input": "Hello world.", "voice": "x", "response_format": "wav"}
                async with http.post(f"{url}/v1/audio/speech", json=body) as r:
                    assert r.status == 200
                    speech = await r.read()
            rec = tmp_path / "mic.wav"
            with wave.open(str(rec), "wb") as w, wave.open(io.BytesIO(speech)) as src_w:
                rate = src_w.getframerate()
                pcm = np.frombuffer(src_w.readframes(src_w.getnframes()), dtype="<i2")
                gap = np.zeros(rate, dtype="<i2")
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(rate)
                w.writeframes(np.concatenate([gap // 2, pcm, gap]).tobytes())
            bar.source_factory = lambda: WavSource(rec)
            key(page.input, QEvent.Type.KeyPress)  # F9 held in the message box
            assert bar.talk_task is not None and bar.missing.text() == ""
            shown = lambda: (  # noqa: E731
                f"live={bar.live.text()!r} status={page.status.text()!r} talking={bar.talk_task is not None}"
            )
            await until(lambda: "hello" in bar.live.text().lower(), state=shown)  # before the release
            key(page.input, QEvent.Type.KeyRelease)
            await until(lambda: bar.talk_task is None, state=shown)
            users = [m.content for m in page.store.messages(page.current) if m.role == "user"]
            assert len(users) == 1 and "hello" in users[0].lower(), users
            await desk.tasks.settle()
            # --- read aloud: two sentences, each synthesized and played in turn
            page.store.add(page.current, "assistant", "Hello there. This is **the reply**.")
            sink = Sink()
            bar.sink = sink
            bar.read_btn.click()
            assert bar.stop_read_btn.isEnabled()
            await until(lambda: bar.read_task is None)
            assert [p[0] for p in sink.played] == [22050, 22050]
            assert all(n > 22050 * 0.3 and peak > 1000 for _, n, peak in sink.played)
            assert not bar.stop_read_btn.isEnabled()
            # --- Stop ends a long reading at once
            page.store.add(page.current, "assistant", " ".join(["One more sentence here."] * 20))
            slow = Sink(slow=True)
            bar.sink = slow
            bar.read_btn.click()
            await until(lambda: len(slow.played) >= 1)
            bar.stop_read_btn.click()
            await until(lambda: bar.read_task is None, limit=5)
            assert slow.stopped == 1 and len(slow.played) < 20

    qloop.run_until_complete(asyncio.wait_for(scenario(), 120))
