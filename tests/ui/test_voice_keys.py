"""The chat window's own calls on a server that requires API keys and serves TLS with a self-signed
certificate: the chat stream (a real llama.cpp lane), hold-to-talk (the whisper.cpp lane) and read aloud
(the piper lane) all work, with the window's own key and trusting exactly its server's certificate; a call
without a key is refused. "Read aloud" on a reply that is not the last speaks that reply: what the sink
got is transcribed back by whisper. A talk whose first segment server VAD cuts after the release, and
whose last the final commit takes, keeps both."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.support.voice_stack import VOICE, WHISPER, install_voice_models, until  # the stack, or a skip

# isort: split
from PySide6.QtCore import QUrl

from app.core.paths import Paths
from app.core.secrets import KeyStore
from app.core.settings import Settings
from app.server import tls
from tests.support.tinymodels import CHAT, write_tiny_gguf


class Sink:
    """The speakers' stand-in: the PCM played, at its rate."""

    def __init__(self) -> None:
        self.pcm: list[np.ndarray] = []
        self.rate = 0

    async def play(self, pcm: bytes, *, rate: int) -> None:
        self.pcm.append(np.frombuffer(pcm, dtype="<i2"))
        self.rate = rate

    def stop(self) -> None:
        pass


class PcmSource:
    """24 kHz PCM16 in 100 ms blocks; sets `released` with the last block (the user lets go as the
    recording ends, before the server has answered what it was sent)."""

    def __init__(self, pcm: np.ndarray, released: asyncio.Event) -> None:
        self.pcm, self.released = pcm, released

    async def chunks(self) -> AsyncIterator[bytes]:
        step = 2400
        for i in range(0, self.pcm.size, step):
            if i + step >= self.pcm.size:
                self.released.set()
            yield self.pcm[i : i + step].tobytes()
            await asyncio.sleep(0)

    def stop(self) -> None:
        pass


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


def test_chat_and_voice_with_a_required_key_over_tls(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop
    from app.ui.voice import RATE, WavSource, transcribe_live
    from app.ui.window_access import WINDOW_KEY, window_access

    models = tmp_path / "models"
    install_voice_models(models)
    write_tiny_gguf(models / "tiny-chat-Q8_0.gguf", CHAT)
    paths = Paths(home=isolated_env)
    pair = tls.self_signed(paths, host="127.0.0.1")  # served because the settings name it
    settings = Settings.flat(
        port=0,
        models_dirs=(models,),
        idle_ttl_s=0,
        require_api_key=True,
        tls_cert=str(pair.cert),
        tls_key=str(pair.key),
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            assert desk.server.running and str(desk.server.url).startswith("https://")
            access = await window_access(desk)
            assert access.key is not None and access.ssl is not None
            assert [k.name for k in KeyStore.at(paths).entries()] == [WINDOW_KEY]  # shown on the Server page
            # the server really wants a key: the same call without it is refused
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=access.ssl)) as bare,
                bare.get(f"{access.url}/v1/models") as r,
            ):
                assert r.status == 401
            # and the window's certificate trust is real: a default context does not accept it
            async with aiohttp.ClientSession() as default:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await default.get(f"{access.url}/v1/models")

            page: Any = desk.window.show_page("Chat")
            bar = page.voice
            chat = next(e.id for e in desk.runtime.catalog.entries() if "tiny-chat" in e.id)
            page.model.setCurrentIndex(page.model.findData(chat))
            assert page.model.currentData() == chat
            # --- hold-to-talk: Piper's speech as the microphone, through the window's access
            async with access.session() as http:
                body = {"model": VOICE, "input": "Hello world.", "voice": "x", "response_format": "wav"}
                async with http.post(f"{access.url}/v1/audio/speech", json=body) as r:
                    assert r.status == 200, await r.text()
                    speech = await r.read()
            with wave.open(io.BytesIO(speech)) as w:
                rate = w.getframerate()
                said = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
            rec = tmp_path / "mic.wav"
            gap = np.zeros(rate, dtype="<i2")
            rec.write_bytes(wav_bytes(np.concatenate([gap // 2, said, gap]), rate))
            bar.source_factory = lambda: WavSource(rec)
            bar.press()
            assert bar.talk_task is not None and bar.missing.text() == ""
            await asyncio.sleep(0.5)
            bar.release()
            await until(lambda: bar.talk_task is None, limit=90)
            users = [m.content for m in page.store.messages(page.current or 0) if m.role == "user"]
            assert len(users) == 1 and "hello" in users[0].lower(), (users, page.status.text())
            # --- the chat stream it started: a reply from the llama.cpp lane, no error
            await until(lambda: page.stream_task is None, limit=120)
            msgs = page.store.messages(page.current)
            assert not [m.content for m in msgs if m.role == "error"]
            assert [m.role for m in msgs] == ["user", "assistant"] and msgs[-1].content

            # --- read aloud a reply that is not the last: that reply is what is heard
            first = page.store.add(page.current, "assistant", "Good morning. The weather is sunny today.")
            page.store.add(page.current, "assistant", "Goodbye.")
            page.show_messages()
            assert f"speak:{first}" in page.view.toMarkdown()  # each reply has its own link
            sink = Sink()
            bar.sink = sink
            page._link(QUrl(f"speak:{first}"))  # the link under that reply
            assert bar.read_task is not None and bar.stop_read_btn.isEnabled()
            await until(lambda: bar.read_task is None, limit=90)
            assert len(sink.pcm) == 2  # sentence by sentence
            heard = wav_bytes(np.concatenate(sink.pcm), sink.rate)
            async with access.session() as http:
                form = aiohttp.FormData()
                form.add_field("model", WHISPER)
                form.add_field("file", heard, filename="heard.wav", content_type="audio/wav")
                async with http.post(f"{access.url}/v1/audio/transcriptions", data=form) as r:
                    assert r.status == 200, await r.text()
                    text = (await r.json())["text"].lower()
            assert "morning" in text and "weather" in text and "goodbye" not in text, text

            # --- a talk released as the recording ends: the first segment server VAD cuts (its commit
            # reaches the window after the release) and the last, taken by the final commit, both count
            async with access.session() as http:
                body = {"model": VOICE, "input": "This is a test.", "voice": "x", "response_format": "wav"}
                async with http.post(f"{access.url}/v1/audio/speech", json=body) as r:
                    with wave.open(io.BytesIO(await r.read())) as w:
                        second = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")

            def to24(pcm: np.ndarray) -> np.ndarray:
                n = round(pcm.size * RATE / rate)
                return np.interp(np.arange(n) * rate / RATE, np.arange(pcm.size), pcm).astype("<i2")

            talk = np.concatenate([to24(said), np.zeros(RATE, dtype="<i2"), to24(second)])
            released = asyncio.Event()
            got = await transcribe_live(
                access,
                model=WHISPER,
                source=PcmSource(talk, released),
                released=released,
                on_text=lambda _: None,
            )
            assert "hello" in got.lower() and "test" in got.lower(), got

    qloop.run_until_complete(asyncio.wait_for(scenario(), 300))
