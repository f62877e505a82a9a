"""Talking to the chat: hold-to-talk (microphone -> the gateway's live transcription -> the message) and
"read aloud" (a reply -> Piper, sentence by sentence -> the speakers), through the same local server every
client uses.

Audio goes through `sounddevice` (PortAudio): a few hundred kB, numpy blocks in and out, where Qt
Multimedia would add PySide6's add-ons (hundreds of MB) to the bundle. Sources and sinks are small
objects, so a recorded WAV can stand in for the microphone.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import importlib
import json
import re
import wave
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import aiohttp
import numpy as np
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from app.ui.window_access import Access, window_access

if TYPE_CHECKING:
    from app.chat.store import ChatStore
    from app.ui.context import Desk

RATE = 24000  # what the Realtime API takes
CHUNK_S = 0.1
STOP_GRACE_S = 1.0  # how long a stopped source may take to hand over what it had captured
READ_TIP = "Read the last reply aloud; each reply also has its own Read aloud link"
SHORTCUT = Qt.Key.Key_F9  # held down in the chat window: talk


class AudioSource(Protocol):
    def chunks(self) -> AsyncIterator[bytes]:
        """PCM16 mono at 24 kHz, as it is captured; ends when stopped."""
        ...

    def stop(self) -> None: ...


class AudioSink(Protocol):
    async def play(self, pcm: bytes, *, rate: int) -> None: ...

    def stop(self) -> None: ...


def _sd() -> Any:
    # PortAudio's binding, looked up when used: without it (or libportaudio2) the controls say so
    return importlib.import_module("sounddevice")


def audio_missing() -> str | None:
    """Why this installation has no audio at all (the sounddevice package or PortAudio is missing), or
    None; no device is opened, so it is cheap enough to ask whenever the chat page shows."""
    try:
        _sd()
    except ImportError:
        return (
            "Voice needs the sounddevice package, which this installation lacks; install Switchyard with "
            "its desktop extras (the gui extra) to talk and listen"
        )
    except OSError as exc:  # sounddevice without the PortAudio library (Debian: libportaudio2)
        return f"Voice needs the PortAudio library (libportaudio2 on Debian and Ubuntu): {exc}"
    return None


def microphone_problem() -> str | None:
    """Why the microphone cannot be used, or None."""
    try:
        sd = _sd()
        sd.check_input_settings(samplerate=RATE, channels=1, dtype="int16")
    except ImportError:
        return "Voice input needs the sounddevice package: pip install sounddevice (and PortAudio)"
    except Exception as exc:  # PortAudio's own errors: no device, or none that records mono at 24 kHz
        return f"No microphone found: {exc}"
    return None


def speaker_problem() -> str | None:
    """Why replies cannot be played, or None."""
    try:
        _sd().check_output_settings(samplerate=22050, channels=1, dtype="int16")
    except ImportError:
        return "Reading aloud needs the sounddevice package: pip install sounddevice (and PortAudio)"
    except Exception as exc:  # PortAudio's own errors: no output device
        return f"No speaker found: {exc}"
    return None


class MicSource:
    """The default input device, in 100 ms blocks."""

    def __init__(self) -> None:
        # PortAudio's thread appends, the loop takes: the blocks themselves never go through the loop's
        # call queue, so stop() cannot overtake a block captured just before it (under qasync a call from
        # the GUI thread runs ahead of those posted by another thread)
        self._captured: collections.deque[bytes] = collections.deque()
        self._more = asyncio.Event()
        self._stream: Any = None
        self._stopped = False

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._stopped:  # stopped before recording began: the device is never opened
            return
        loop = asyncio.get_running_loop()
        sd = _sd()

        def captured(data: Any, _frames: int, _time: Any, _status: Any) -> None:
            self._captured.append(bytes(data))
            loop.call_soon_threadsafe(self._more.set)

        self._stream = sd.RawInputStream(
            samplerate=RATE, channels=1, dtype="int16", blocksize=int(RATE * CHUNK_S), callback=captured
        )
        try:
            self._stream.start()
            while True:
                over = self._stopped  # read first: once stopped, every block is already captured
                while self._captured:
                    yield self._captured.popleft()
                if over:
                    return
                self._more.clear()
                if not self._captured and not self._stopped:
                    await self._more.wait()
        finally:  # ended, stopped or cancelled: the device is closed either way
            self._close()

    def stop(self) -> None:
        self._close()
        self._stopped = True
        self._more.set()

    def _close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.stop()  # returns once the callback is over: no block comes after it
            stream.close()


class WavSource:
    """A recorded WAV in place of the microphone (any rate; mono or the first channel)."""

    def __init__(self, path: Path) -> None:
        with wave.open(str(path)) as w:
            rate, channels = w.getframerate(), w.getnchannels()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, channels)[:, 0]
        n = round(pcm.size * RATE / rate)
        self._pcm = np.interp(np.arange(n) * rate / RATE, np.arange(pcm.size), pcm).astype("<i2")
        self._stopped = False

    async def chunks(self) -> AsyncIterator[bytes]:
        step = int(RATE * CHUNK_S)
        for i in range(0, self._pcm.size, step):
            if self._stopped:
                return
            yield self._pcm[i : i + step].tobytes()
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._stopped = True


class SpeakerSink:
    """The default output device."""

    def __init__(self) -> None:
        self._stream: Any = None

    async def play(self, pcm: bytes, *, rate: int) -> None:
        sd = _sd()
        if self._stream is None or self._stream.samplerate != rate:
            self.stop()
            self._stream = sd.RawOutputStream(samplerate=rate, channels=1, dtype="int16")
            self._stream.start()
        await asyncio.to_thread(self._stream.write, pcm)

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.abort()
            self._stream.close()
            self._stream = None


class Recording:
    """`source` recorded into memory from the moment this is made (the press) until `released` is set, so
    what is said while the connection to the server opens is kept and sent once it is open. (A talk used
    to open the microphone only once connected: a slow connection lost the start of the speech, or all of
    it.) At the release the source is stopped; the blocks it had captured by then still come, then the end.
    A source that does not end within STOP_GRACE_S of being stopped is cut off there."""

    def __init__(self, source: AudioSource, *, released: asyncio.Event) -> None:
        self.source = source
        self.released = released
        self._blocks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._record())

    async def _record(self) -> None:
        stopper = asyncio.ensure_future(self._stop_at_release())
        try:
            async for block in self.source.chunks():
                self._blocks.put_nowait(block)
        finally:
            stopper.cancel()
            self._blocks.put_nowait(None)

    async def _stop_at_release(self) -> None:
        await self.released.wait()
        self.source.stop()
        await asyncio.sleep(STOP_GRACE_S)
        self._task.cancel()

    async def next_block(self) -> bytes | None:
        """The next block recorded, waiting for it; None once the recording is over (the release, or the
        source ran out). A source that failed raises its error here."""
        block = await self._blocks.get()
        if block is None:
            self._blocks.put_nowait(None)  # asked again, the answer stays: over
            failed = self._task.exception() if self._task.done() and not self._task.cancelled() else None
            if failed is not None:
                raise failed
        return block

    async def close(self) -> None:
        """The source stopped and the recording over (cancelled where it does not end by itself)."""
        self.source.stop()
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def sentences(text: str) -> list[str]:
    """The reply in pieces Piper can say one after another (so playback starts with the first)."""
    plain = re.sub(r"```.*?```", " ", text, flags=re.S)  # code is not read out
    plain = re.sub(r"[*_`#>]+", "", plain)
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n{2,}", plain) if s.strip()]


async def transcribe_live(
    access: Access,
    *,
    model: str,
    source: AudioSource | Recording,
    released: asyncio.Event,
    on_text: Callable[[str], None],
) -> str:
    """Stream `source` to the server's live transcription until `released` is set; the whole transcript.
    `on_text` gets the text so far each time a delta or a segment arrives.

    The source is recorded from the call on (a `Recording` given is used as it is: the window starts
    one at the press), and every block recorded before the release is sent, however long the connection
    took to open; server VAD counts audio, not time, so a backlog sent at once is cut the same way. At the
    release the speech still going on is committed, then the buffer is cleared: the server answers events
    in order, so every item committed before `input_audio_buffer.cleared` arrives is one of ours, whether
    server VAD cut it (possibly just after the release) or the final commit did, and the call returns
    once each of those items has its transcript. None is dropped."""
    recording = source if isinstance(source, Recording) else Recording(source, released=released)
    done: dict[str, str] = {}  # item id -> its transcript, in the order the items were committed
    partial: dict[str, str] = {}
    pending: set[str] = set()  # committed, transcript not yet here
    closed = asyncio.Event()  # `cleared` arrived: no item of this talk is still to be committed
    ws_url = access.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)

    def text_so_far() -> str:
        return " ".join([*(t for t in done.values() if t), *partial.values()]).strip()

    def take(event: dict[str, Any]) -> None:
        kind, item = event.get("type", ""), event.get("item_id", "")
        if kind == "input_audio_buffer.committed":
            pending.add(item)
            done.setdefault(item, "")
        elif kind == "input_audio_buffer.cleared":
            closed.set()
        elif kind.endswith("input_audio_transcription.delta"):
            partial[item] = partial.get(item, "") + event.get("delta", "")
        elif kind.endswith(("input_audio_transcription.completed", "input_audio_transcription.failed")):
            partial.pop(item, None)
            pending.discard(item)
            done[item] = event.get("transcript", "").strip()
        elif kind == "error":
            # an empty final commit: released outside speech, every segment was committed already
            if event["error"].get("code") != "input_audio_buffer_commit_empty":
                raise RuntimeError(event["error"]["message"])
        on_text(text_so_far())

    try:
        async with (
            access.session() as http,
            http.ws_connect(f"{ws_url}/v1/realtime?intent=transcription") as ws,
        ):
            turns = {"type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 300}
            session = {"input_audio_transcription": {"model": model}, "turn_detection": turns}
            await ws.send_json({"type": "transcription_session.update", "session": session})

            async def receive() -> None:
                async for msg in ws:
                    if msg.type is not aiohttp.WSMsgType.TEXT:
                        break
                    take(json.loads(msg.data))
                    if closed.is_set() and not pending:
                        return
                raise RuntimeError("the server closed the live transcription before it finished")

            reader = asyncio.ensure_future(receive())
            try:
                # what was recorded while connecting, then the rest as it comes, to the recording's end
                while not reader.done() and (block := await recording.next_block()) is not None:
                    audio = base64.b64encode(block).decode()
                    await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
                waiter = asyncio.ensure_future(released.wait())  # a recording that ended early waits for it
                try:
                    await asyncio.wait([reader, waiter], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if not reader.done():
                    await ws.send_json({"type": "input_audio_buffer.commit"})  # the speech still going on
                    await ws.send_json({"type": "input_audio_buffer.clear"})  # answered after the commit
                await asyncio.wait_for(reader, 60)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
    finally:
        await recording.close()
    return " ".join(t for t in done.values() if t).strip()


async def speak(access: Access, *, voice: str, text: str, sink: AudioSink) -> None:
    """Say `text` with the Piper `voice`: each sentence synthesized while the one before it plays, so the
    first is heard as soon as it is made."""
    async with access.session() as http:

        async def synth(sentence: str) -> tuple[bytes, int]:
            body = {"model": voice, "input": sentence, "voice": voice, "response_format": "pcm"}
            async with http.post(f"{access.url}/v1/audio/speech", json=body) as r:
                if r.status >= 400:
                    raise RuntimeError((await r.json())["error"]["message"])
                return await r.read(), int(r.headers.get("x-sample-rate", "22050"))

        parts = sentences(text)
        next_one = asyncio.ensure_future(synth(parts[0])) if parts else None
        try:
            for i in range(len(parts)):
                assert next_one is not None
                pcm, rate = await next_one
                next_one = asyncio.ensure_future(synth(parts[i + 1])) if i + 1 < len(parts) else None
                await sink.play(pcm, rate=rate)
        finally:
            if next_one is not None:
                next_one.cancel()
                with contextlib.suppress(BaseException):
                    await next_one


@runtime_checkable
class Searches(Protocol):
    """The Discover page, as far as the voice bar sends a person there (no import of it: a cycle)."""

    def search_for(self, text: str) -> None: ...


class ChatHost(Protocol):
    """What the voice bar asks of its chat page (a Protocol: the page imports this module, not back)."""

    desk: Desk
    store: ChatStore
    current: int | None

    def send(self, text: str | None = None) -> asyncio.Task[Any] | None: ...

    def report(self, msg: str) -> None: ...


class VoiceBar(QWidget):
    """Hold-to-talk, the live transcript, read aloud and its stop, and what is missing, for a chat page.

    `page` gives `desk` (server, catalog, window), `send(text)`, `report(msg)` and its conversation
    (`store`, `current`); `parent` is the page's widget, whose keys (F9) the bar listens to."""

    def __init__(self, page: ChatHost, *, parent: QWidget) -> None:
        super().__init__(parent)
        self.page, self.desk = page, page.desk
        self._source_factory: Callable[[], AudioSource] = MicSource
        self._sink: AudioSink = SpeakerSink()
        self.released = asyncio.Event()
        self.talk_task: asyncio.Task[Any] | None = None
        self.read_task: asyncio.Task[Any] | None = None
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.talk_btn = QPushButton("Hold to talk (F9)")
        self.talk_btn.pressed.connect(self.press)
        self.talk_btn.released.connect(self.release)
        self.read_btn = QPushButton("Read aloud")
        self.read_btn.setToolTip(READ_TIP)
        self.read_btn.clicked.connect(lambda: self.read_aloud())
        self.stop_read_btn = QPushButton("Stop reading")
        self.stop_read_btn.clicked.connect(self.stop_reading)
        self.stop_read_btn.setEnabled(False)
        self.live = QLabel("")
        self.live.setWordWrap(True)
        self.missing = QLabel("")
        self.missing.setWordWrap(True)
        self.get_btn = QPushButton("Find one on Discover")
        self.get_btn.clicked.connect(self._discover)
        self.get_btn.setVisible(False)
        for w in (self.talk_btn, self.read_btn, self.stop_read_btn):
            row.addWidget(w)
        row.addWidget(self.live, 1)
        row.addWidget(self.missing)
        row.addWidget(self.get_btn)
        self._wanted = ""
        parent.installEventFilter(self)

    # ---- what is there ---------------------------------------------------------------------------
    # the audio in and out: another source or sink (a recording, a test's) turns its button on at once
    @property
    def source_factory(self) -> Callable[[], AudioSource]:
        return self._source_factory

    @source_factory.setter
    def source_factory(self, factory: Callable[[], AudioSource]) -> None:
        self._source_factory = factory
        self.refresh_devices()

    @property
    def sink(self) -> AudioSink:
        return self._sink

    @sink.setter
    def sink(self, sink: AudioSink) -> None:
        self._sink = sink
        self.refresh_devices()

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.refresh_devices()

    def refresh_devices(self) -> None:
        """The buttons are off, saying why, where this installation has no audio: a press would only say
        so afterwards. Audio given by the caller (source_factory, sink) needs no package."""
        missing = audio_missing()
        for button, ours, tip in (
            (
                self.talk_btn,
                self.source_factory is MicSource,
                "Hold to talk (or hold F9): speak, release to send",
            ),
            (self.read_btn, isinstance(self.sink, SpeakerSink), READ_TIP),
        ):
            off = missing if ours else None
            button.setEnabled(off is None)
            button.setToolTip(off or tip)
        self._say_missing(missing if missing and self.source_factory is MicSource else None)

    def _model_of(self, kind: str) -> str | None:
        return next((e.id for e in self.desk.runtime.catalog.entries() if e.kind == kind), None)

    def problem(self, *, talk: bool) -> str | None:
        """What is missing for talking (`talk`) or reading aloud; shown with the way to get it."""
        srv = self.desk.server
        if not srv.running or not srv.url:
            return "The local server is stopped: start it on the Server page."
        kind, what, query = (
            ("transcription", "No whisper model is installed", "whisper ggml")
            if talk
            else ("speech", "No Piper voice is installed", "piper voice")
        )
        if self._model_of(kind) is None:
            self._wanted = query
            return f"{what}: download one to {'talk' if talk else 'read replies aloud'}."
        if talk and self.source_factory is MicSource and (mic := microphone_problem()) is not None:
            return mic
        if not talk and isinstance(self.sink, SpeakerSink) and (out := speaker_problem()) is not None:
            return out
        return None

    def _say_missing(self, text: str | None) -> None:
        self.missing.setText(text or "")
        self.get_btn.setVisible(bool(text) and bool(self._wanted) and "download" in (text or ""))

    def _discover(self) -> None:
        page = self.desk.window.show_page("Discover")
        if isinstance(page, Searches):
            page.search_for(self._wanted)

    # ---- hold to talk ----------------------------------------------------------------------------
    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
            key: Any = event
            if key.key() == SHORTCUT and not key.isAutoRepeat():
                self.press() if event.type() == QEvent.Type.KeyPress else self.release()
                return True
        return False

    def press(self) -> None:
        if self.talk_task is not None:
            return
        problem = self.problem(talk=True)
        self._say_missing(problem)
        if problem:
            return
        self.released.clear()
        self.live.setText("Listening…")
        self.talk_task = self.desk.spawn(self._talk(), report=self.page.report)
        self.talk_task.add_done_callback(lambda _: setattr(self, "talk_task", None))

    def release(self) -> None:
        self.released.set()

    async def _talk(self) -> None:
        model = self._model_of("transcription")
        assert model is not None
        recording = Recording(self.source_factory(), released=self.released)  # from the press on
        try:
            text = await transcribe_live(
                await window_access(self.desk),  # may take a while (a new key): the recording goes on
                model=model,
                source=recording,
                released=self.released,
                on_text=lambda t: self.live.setText(t or "Listening…"),
            )
        finally:
            await recording.close()
        self.live.setText("")
        if text:
            self.page.send(text)
        else:
            self.page.report("Nothing was heard: hold the button while you speak.")

    # ---- read aloud ------------------------------------------------------------------------------
    def reply_text(self, message_id: int | None = None) -> str | None:
        """The reply `message_id` of the shown conversation (None: the last one with text)."""
        if self.page.current is None:
            return None
        replies = [m for m in self.page.store.messages(self.page.current) if m.role == "assistant"]
        if message_id is not None:
            return next((m.content for m in replies if m.id == message_id and m.content), None)
        return next((m.content for m in reversed(replies) if m.content), None)

    def read_aloud(self, message_id: int | None = None) -> asyncio.Task[Any] | None:
        """Read reply `message_id` (its "Read aloud" link), or the last reply (the button); a reading
        already going on stops first."""
        problem = self.problem(talk=False)
        self._say_missing(problem)
        reply = self.reply_text(message_id)
        if problem:
            return None
        if not reply:
            self.page.report("No reply to read yet." if message_id is None else "That reply is empty.")
            return None
        self.stop_reading()
        voice = self._model_of("speech")
        assert voice is not None
        self.stop_read_btn.setEnabled(True)

        async def read() -> None:
            await speak(await window_access(self.desk), voice=voice, text=reply, sink=self.sink)

        task = self.desk.spawn(read(), report=self.page.report)
        self.read_task = task

        def done(_: Any) -> None:
            if self.read_task is task:
                self.read_task = None
                self.stop_read_btn.setEnabled(False)

        task.add_done_callback(done)
        return task

    def stop_reading(self) -> None:
        if self.read_task is not None:
            self.read_task.cancel()
            self.sink.stop()
