"""`python -m app.lanes.workers.whisper --ppid N --params JSON`: whisper.cpp behind OpenAI's audio routes.

`POST /v1/audio/transcriptions` and `/v1/audio/translations`, multipart: file (WAV at any rate; other
formats through ffmpeg when installed), model, language, prompt, response_format (json, text, srt, vtt,
verbose_json), temperature, stream (true: server-sent `transcript.text.delta` events, one per decoded
segment, then `transcript.text.done`). One decode at a time: a whisper context is not safe to share
between threads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import ModuleType
from typing import Any

import numpy as np
from aiohttp import web

from app.lanes.workers.audio import RATE, AudioError, decode
from app.lanes.workers.http_host import error, log, run
from app.lanes.workers.params import WhisperParams
from app.lanes.workers.transcript import delta, joined

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MAX_UPLOAD = 25 << 20  # OpenAI's limit


def _stamp(centis: int, *, sep: str) -> str:
    ms = max(0, int(centis)) * 10
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def render(segments: list[Any], *, fmt: str, task: str, language: str, duration: float) -> web.Response:
    text = joined(s.text for s in segments)
    if fmt == "json":
        return web.json_response({"text": text})
    if fmt == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if fmt in ("srt", "vtt"):
        sep = "," if fmt == "srt" else "."
        blocks = []
        for i, s in enumerate(segments, 1):
            times = f"{_stamp(s.t0, sep=sep)} --> {_stamp(s.t1, sep=sep)}"
            blocks.append(
                f"{i}\n{times}\n{s.text.strip()}\n" if fmt == "srt" else f"{times}\n{s.text.strip()}\n"
            )
        head = "WEBVTT\n\n" if fmt == "vtt" else ""
        ctype = "application/x-subrip" if fmt == "srt" else "text/vtt"
        return web.Response(text=head + "\n".join(blocks), content_type=ctype)
    return web.json_response(
        {
            "task": task,
            "language": language,
            "duration": round(duration, 3),
            "text": text,
            "segments": [
                {"id": i, "start": s.t0 / 100, "end": s.t1 / 100, "text": s.text, "temperature": None}
                for i, s in enumerate(segments)
            ],
        }
    )


async def stream_segments(
    request: web.Request, model: Any, lock: threading.Lock, samples: np.ndarray, kw: dict[str, Any]
) -> web.StreamResponse:
    """OpenAI's streamed transcription: a `transcript.text.delta` event per segment as whisper.cpp decodes
    it, then `transcript.text.done`. A client that goes away aborts the decode at whisper's next check."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    gone = threading.Event()
    aborted: list[bool] = []

    def abort() -> bool:
        if gone.is_set() and not aborted:
            aborted.append(True)
        return bool(aborted)

    def run() -> None:
        try:
            with lock:
                log(f"decoding {samples.size / RATE:.2f} s of audio (streamed)")
                t0 = time.monotonic()
                model.transcribe(
                    samples,
                    new_segment_callback=lambda seg: loop.call_soon_threadsafe(queue.put_nowait, seg.text),
                    abort_callback=abort,
                    **kw,
                )
                took = time.monotonic() - t0
                # the line a test (and a user reading the lane's log) tells a cancelled decode by
                log(
                    f"decode aborted after {took:.2f} s: the client went away"
                    if aborted
                    else f"decoded in {took:.2f} s"
                )
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    decode = asyncio.ensure_future(asyncio.to_thread(run))
    parts: list[str] = []
    try:
        while True:
            try:  # between segments, notice a client that went away: the decode stops now, not later
                text = await asyncio.wait_for(queue.get(), 0.1)
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    gone.set()
                continue
            if text is None:
                break
            piece = delta("".join(parts), text)  # with the space before it, as the whole text has it
            parts.append(piece)
            await _event(resp, {"type": "transcript.text.delta", "delta": piece})
        await decode
        if gone.is_set():
            return resp
        usage = {"type": "duration", "seconds": round(samples.size / RATE, 3)}
        done = {"type": "transcript.text.done", "text": "".join(parts).strip(), "usage": usage}
        await _event(resp, done)
    finally:
        gone.set()
    return resp


def detected_language(model: Any) -> str | None:
    """The language code of the last decode on `model` (whisper.cpp's own detection; an English-only
    model decodes English); None where this pywhispercpp cannot say."""
    try:
        import _pywhispercpp as pw  # type: ignore[import-not-found,unused-ignore]  # the engine's own

        if not pw.whisper_is_multilingual(model._ctx):
            return "en"  # its detection reads noise on a model that only knows English (tiny.en)
        lang = pw.whisper_full_lang_id(model._ctx)
        return str(pw.whisper_lang_str(lang)) if 0 <= lang <= pw.whisper_lang_max_id() else None
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None


async def _event(resp: web.StreamResponse, event: dict[str, Any]) -> None:
    await resp.write(f"data: {json.dumps(event)}\n\n".encode())


def make_app(model: Any, params: WhisperParams) -> web.Application:
    lock = threading.Lock()

    async def handle(request: web.Request, *, task: str) -> web.StreamResponse:
        if not request.content_type.startswith("multipart/"):
            return error(400, "send multipart/form-data with a `file` field (OpenAI's audio upload shape)")
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return error(400, "the `file` field is missing: attach the audio as a file", param="file")
        data = upload.file.read()
        fmt = str(form.get("response_format") or "json")
        if fmt not in FORMATS:
            return error(
                400,
                f"response_format {fmt!r} is unknown; use one of {', '.join(FORMATS)}",
                param="response_format",
            )
        try:
            temperature = float(str(form.get("temperature") or 0))
        except ValueError:
            return error(400, "`temperature` must be a number from 0 to 1", param="temperature")
        if not 0 <= temperature <= 1:
            return error(400, "`temperature` must be a number from 0 to 1", param="temperature")
        language = str(form.get("language") or "") if task == "transcribe" else ""
        prompt = str(form.get("prompt") or "")
        try:
            samples = await asyncio.to_thread(decode, data, filename=upload.filename or "")
        except AudioError as exc:
            return error(400, str(exc), param="file")
        if samples.size == 0:
            return error(400, "the audio file holds no samples", param="file")

        kw: dict[str, Any] = {"translate": task == "translate", "temperature": temperature}
        kw["initial_prompt"] = prompt
        kw["language"] = language or ("en" if task == "translate" else "auto")
        if str(form.get("stream") or "").lower() == "true":
            if task != "transcribe" or fmt not in ("json", "text"):
                return error(400, "stream=true is for transcriptions in json or text format", param="stream")
            return await stream_segments(request, model, lock, samples, kw)

        def run() -> tuple[list[Any], str | None]:
            with lock:
                log(f"decoding {samples.size / RATE:.2f} s of audio")  # one line per engine call
                return list(model.transcribe(samples, **kw)), detected_language(model)

        segments, heard = await asyncio.to_thread(run)
        return render(
            segments,
            fmt=fmt,
            task=task,
            # the language whisper decoded in (what "auto" found), not the word "auto"
            language=language or ("english" if task == "translate" else heard or "unknown"),
            duration=samples.size / RATE,
        )

    async def transcriptions(request: web.Request) -> web.StreamResponse:
        return await handle(request, task="transcribe")

    async def translations(request: web.Request) -> web.StreamResponse:
        return await handle(request, task="translate")

    app = web.Application(client_max_size=MAX_UPLOAD + (1 << 20))
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
    return app


def _load(whisper: ModuleType, params: WhisperParams) -> web.Application | None:
    try:
        # a path, never a name: given a name pywhispercpp would try to download a model. whisper.cpp's own
        # log stays on stderr (the lane's log): it says why a file does not load
        model = whisper.Model(
            params.model_path,
            redirect_whispercpp_logs_to=False,
            n_threads=params.threads,
            print_progress=False,
        )
    except Exception as exc:  # a bad file surfaces as several exception types from the binding
        log(f"whisper.cpp could not load {params.model_path}: {type(exc).__name__}: {exc}")
        return None
    # pywhispercpp does not report a failed load; decoding with one crashes. So decode a moment of silence
    # before saying we serve: a bad model fails the start (with this line in the log), not a request
    log(f"loaded {params.model_path}; checking it on 0.1 s of silence")
    model.transcribe(np.zeros(RATE // 10, dtype=np.float32))
    return make_app(model, params)


def main(argv: list[str] | None = None) -> int:
    engine = ("pywhispercpp.model", "pywhispercpp")
    return run("app.lanes.workers.whisper", WhisperParams, argv, engine=engine, load=_load)


if __name__ == "__main__":
    raise SystemExit(main())
