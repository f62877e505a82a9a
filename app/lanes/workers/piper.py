"""`python -m app.lanes.workers.piper --ppid N --params JSON`: a Piper voice behind OpenAI's speech route.

`POST /v1/audio/speech` {model, input, voice, response_format: wav|pcm, speed 0.25-4}: `wav` is a
16-bit mono WAV at the voice's own rate; `pcm` the same samples without a header (the rate is in the
`X-Sample-Rate` header: Piper voices are 16 or 22.05 kHz, not OpenAI's 24 kHz). `voice` picks a speaker
of a multi-speaker voice; a single-speaker voice accepts any name (clients always send one).
"""

from __future__ import annotations

import asyncio
import io
import threading
import wave
from types import ModuleType
from typing import Any

from aiohttp import web

from app.lanes.workers.http_host import error, log, run
from app.lanes.workers.params import PiperParams

FORMATS = ("wav", "pcm")
MAX_INPUT = 4096  # OpenAI's limit on `input`


def _synthesize(voice: Any, text: str, *, speed: float, speaker: int | None) -> tuple[bytes, int]:
    from piper import SynthesisConfig

    base = voice.config.length_scale or 1.0
    cfg = SynthesisConfig(speaker_id=speaker, length_scale=base / speed)
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text, syn_config=cfg))
    return pcm, int(voice.config.sample_rate)


def _wav(pcm: bytes, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def make_app(voice: Any, params: PiperParams) -> web.Application:
    lock = threading.Lock()  # one synthesis at a time: onnxruntime already uses every core for one
    speakers: dict[str, int] = dict(getattr(voice.config, "speaker_id_map", None) or {})

    async def speech(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body must be a JSON object")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return error(400, "`input` must be a non-empty string: the text to speak", param="input")
        if len(text) > MAX_INPUT:
            return error(400, f"`input` is {len(text)} characters; at most {MAX_INPUT}", param="input")
        fmt = body.get("response_format") or "wav"
        if fmt not in FORMATS:
            return error(
                400,
                f"response_format {fmt!r} is not available from Piper here; use one of {', '.join(FORMATS)}",
                param="response_format",
            )
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or isinstance(speed, bool) or not 0.25 <= speed <= 4.0:
            return error(400, "`speed` must be a number from 0.25 to 4.0", param="speed")
        speaker: int | None = None
        name = body.get("voice")
        if speakers:
            if name not in speakers:
                known = ", ".join(sorted(speakers))
                return error(
                    400, f"voice {name!r} is not a speaker of this voice; speakers: {known}", param="voice"
                )
            speaker = speakers[name]

        def run() -> tuple[bytes, int]:
            with lock:
                return _synthesize(voice, text, speed=float(speed), speaker=speaker)

        pcm, rate = await asyncio.to_thread(run)
        headers = {"X-Sample-Rate": str(rate)}
        if fmt == "pcm":
            return web.Response(body=pcm, content_type="audio/pcm", headers=headers)
        return web.Response(body=_wav(pcm, rate), content_type="audio/wav", headers=headers)

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/v1/audio/speech", speech)
    return app


def _load(piper: ModuleType, params: PiperParams) -> web.Application | None:
    try:
        voice = piper.PiperVoice.load(params.model_path, config_path=params.config_path)
    except Exception as exc:  # onnxruntime and the config reader raise many kinds; all mean "cannot load"
        log(f"piper could not load the voice {params.model_path}: {type(exc).__name__}: {exc}")
        return None
    return make_app(voice, params)


def main(argv: list[str] | None = None) -> int:
    return run("app.lanes.workers.piper", PiperParams, argv, engine=("piper", "piper-tts"), load=_load)


if __name__ == "__main__":
    raise SystemExit(main())
