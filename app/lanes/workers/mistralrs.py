"""`python -m app.lanes.workers.mistralrs --ppid N --params JSON`: one mistralrs Runner behind OpenAI routes.

`POST /v1/chat/completions` and `POST /v1/completions` (both with `stream`), `GET /v1/models`, `/health`.
The Runner refuses a second caller while one is inside it ("Already borrowed"), so every call into it
holds one lock. A chat request only holds it to start its stream: the engine then batches the streams of
several requests itself, and each chunk is awaited in a thread so the event loop keeps serving. Dropping a
stream stops its generation, which is what a client that hangs up gets. A completion has no streaming
call in the Python API: it runs whole under the lock, and a `stream: true` completion arrives as one
text event (a client that hangs up cannot stop it). Request translation is in mistralrs_api.py.

With `mtp_model` set the Runner loads an MTP assistant beside the model and drafts with it (speculative
decoding; mistral.rs checks every drafted token with the model, so the answer is the model's own).

Exit codes: 0 SIGTERM, 3 the server is gone, 4 the model is missing, 5 mistral.rs could not load it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from app.lanes.engines import mistralrs_api as api
from app.lanes.workers.http_host import error, log, serve, started

_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


class Engine:
    """The one Runner, the lock every call into it holds, and the threads its blocking calls run in."""

    def __init__(self, runner: Any, module: Any, *, model: str, threads: int) -> None:
        self.runner = runner
        self.mod = module  # the mistralrs module: its request classes
        self.model = model
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mistralrs")

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _locked(self, method: Callable[[Any], Any], request: Any) -> Any:
        with self._lock:
            return method(request)

    async def start_chat(self, fields: dict[str, Any]) -> Any:
        req = self.mod.ChatCompletionRequest(model=self.model, stream=True, **fields)
        return await self._run(self._locked, self.runner.send_chat_completion_request, req)

    async def next_chunk(self, stream: Any) -> Any:
        return await self._run(next, stream, None)

    async def complete(self, fields: dict[str, Any]) -> Any:
        req = self.mod.CompletionRequest(model=self.model, **fields)
        return await self._run(self._locked, self.runner.send_completion_request, req)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _refusal(exc: BaseException) -> tuple[int, str, str]:
    """(status, message, code): mistral.rs raises ValueError for a request it will not run (a prompt
    longer than the model's context, a grammar it cannot parse): a 400. Anything else is its failure."""
    text = str(exc).split("<state>")[0].strip()[:2000] or type(exc).__name__  # grammar errors dump state
    if isinstance(exc, ValueError):
        code = "context_length_exceeded" if "length is greater than" in text else "invalid_request"
        return 400, f"mistral.rs refused the request: {text}", code
    return 500, f"mistral.rs failed: {type(exc).__name__}: {text}", "engine_error"


def refused(exc: BaseException, *, param: str) -> web.Response:
    status, message, code = _refusal(exc)
    return error(status, message, param=param if status < 500 else None, code=code)


async def read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise api.BadBody(f"the body is not valid JSON ({exc}); send one JSON object") from None
    if not isinstance(body, dict):
        raise api.BadBody(f"the body must be a JSON object, not {type(body).__name__}")
    return body


async def sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


def _ours(exc: BaseException) -> bool:
    """Whether an exception is the engine's (including a Rust panic, a BaseException), not a shutdown."""
    return not isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit | asyncio.CancelledError)


async def chat(request: web.Request, engine: Engine) -> web.StreamResponse:
    call = api.chat_call(await read_body(request))
    reply = api.Reply.new("chatcmpl", engine.model)
    try:
        stream = await engine.start_chat(call.fields)
        chunk = await engine.next_chunk(stream)  # a refused request fails here, before any answer went out
    except BaseException as exc:
        if not _ours(exc):
            raise
        return refused(exc, param="messages")
    # when this handler returns, the last reference to `stream` goes, and mistral.rs stops generating
    if not call.stream:
        return await _chat_whole(request, engine, stream, chunk, reply)
    resp = await sse_start(request)
    finish, usage = None, None
    try:
        await resp.write(api.sse(api.chat_chunk(reply, delta={"role": "assistant", "content": ""})))
        while chunk is not None:
            for choice in chunk.choices[:1]:
                if delta := _delta(choice.delta):
                    await resp.write(api.sse(api.chat_chunk(reply, delta=delta)))
                finish = api.finish_reason(choice.finish_reason) or finish
            usage = api.usage_json(chunk.usage) or usage
            chunk = await engine.next_chunk(stream)
        # the usage rides on the last event unless the client asked for OpenAI's usage-only event
        tail = None if call.include_usage else usage
        await resp.write(api.sse(api.chat_chunk(reply, delta={}, finish=finish or "stop", usage=tail)))
        if call.include_usage:
            await resp.write(api.sse(api.chat_chunk(reply, delta=None, usage=usage)))
        await resp.write(api.DONE)
    except _GONE:
        log("client went away mid-stream; generation stopped")
    except BaseException as exc:  # the engine failed after the headers went out: the error goes in the stream
        if not _ours(exc):
            raise
        await _stream_error(resp, exc)
    return resp


def _delta(delta: Any) -> dict[str, str]:
    """The text of one streamed step: its content and, for a thinking model, its reasoning."""
    out = {"content": delta.content} if delta.content else {}
    if reasoning := getattr(delta, "reasoning_content", None):
        out["reasoning_content"] = reasoning
    return out


async def _chat_whole(
    request: web.Request, engine: Engine, stream: Any, chunk: Any, reply: api.Reply
) -> web.StreamResponse:
    pieces: list[str] = []
    thoughts: list[str] = []
    finish, usage = None, None
    try:
        while chunk is not None:
            for choice in chunk.choices[:1]:
                pieces.append(choice.delta.content or "")
                thoughts.append(getattr(choice.delta, "reasoning_content", None) or "")
                finish = api.finish_reason(choice.finish_reason) or finish
            usage = api.usage_json(chunk.usage) or usage
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # nobody to answer: stop generating
            chunk = await engine.next_chunk(stream)
    except BaseException as exc:
        if not _ours(exc):
            raise
        return refused(exc, param="messages")
    body = api.chat_response(
        reply, content="".join(pieces), reasoning="".join(thoughts), finish=finish, usage=usage
    )
    return web.json_response(body)


async def _stream_error(resp: web.StreamResponse, exc: BaseException) -> None:
    status, message, code = _refusal(exc)
    kind = "invalid_request_error" if status < 500 else "engine_error"
    event = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    try:
        await resp.write(api.sse(event))
    except _GONE:
        pass


async def completions(request: web.Request, engine: Engine) -> web.StreamResponse:
    call = api.completion_call(await read_body(request))
    reply = api.Reply.new("cmpl", engine.model)
    try:
        res = await engine.complete(call.fields)
    except BaseException as exc:
        if not _ours(exc):
            raise
        return refused(exc, param="prompt")
    choice = res.choices[0]
    finish, usage = api.finish_reason(choice.finish_reason), api.usage_json(res.usage)
    if not call.stream:
        return web.json_response(api.completion_response(reply, text=choice.text, finish=finish, usage=usage))
    resp = await sse_start(request)
    try:
        await resp.write(api.sse(api.completion_chunk(reply, text=choice.text)))
        tail = None if call.include_usage else usage
        await resp.write(api.sse(api.completion_chunk(reply, text="", finish=finish or "stop", usage=tail)))
        if call.include_usage:
            await resp.write(api.sse(api.completion_chunk(reply, text=None, usage=usage)))
        await resp.write(api.DONE)
    except _GONE:
        pass
    return resp


def make_app(engine: Engine) -> web.Application:
    def route(
        handler: Callable[[web.Request, Engine], Any],
    ) -> Callable[[web.Request], Any]:
        async def run(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request, engine)
            except api.BadBody as exc:
                return error(400, exc.message, param=exc.param)

        return run

    async def models(_request: web.Request) -> web.Response:
        card = {"id": engine.model, "object": "model", "created": engine.created, "owned_by": "mistral.rs"}
        return web.json_response({"object": "list", "data": [card]})

    async def close(_app: web.Application) -> None:
        engine.close()

    app = web.Application(client_max_size=32 << 20)
    app.router.add_post("/v1/chat/completions", route(chat))
    app.router.add_post("/v1/completions", route(completions))
    app.router.add_get("/v1/models", models)
    app.on_cleanup.append(close)
    return app


def load(params: api.LaneParams) -> tuple[Any, Any]:
    """(the mistralrs module, a Runner holding the model and, when `mtp_model` names one, its MTP
    assistant); raises what mistralrs raises."""
    import mistralrs

    path = Path(params.model_path)
    which: Any
    if params.source == "gguf":
        files = list(params.files) or [path.name]
        which = mistralrs.Which.GGUF(
            quantized_model_id=str(path.parent), quantized_filename=files if len(files) > 1 else files[0]
        )
    else:
        which = mistralrs.Which.Plain(model_id=str(path))
    speculation: dict[str, Any] = {}
    if params.mtp_model:
        speculation["mtp_model"] = params.mtp_model
        if params.mtp_n_predict > 0:
            speculation["mtp_n_predict"] = params.mtp_n_predict
    # token_source "none": a local model needs no Hugging Face token, so none is read from disk
    runner = mistralrs.Runner(
        which=which, max_seqs=max(1, params.max_seqs), token_source="none", **speculation
    )
    return mistralrs, runner


def engine_message(exc: BaseException) -> str:
    """The engine's words without the Rust backtrace mistral.rs appends under RUST_BACKTRACE (the lane
    shows the log's last lines: the reason must be among them)."""
    return re.split(r"\n\s*0: ", str(exc), maxsplit=1)[0].strip() or type(exc).__name__


def _speculation_line(params: api.LaneParams) -> str:
    per_step = params.mtp_n_predict or "the assistant's own number of"
    return f"speculative decoding on: MTP assistant {params.mtp_model}, {per_step} tokens proposed per step"


def _log_load_failure(params: api.LaneParams, exc: BaseException) -> None:
    log(f"mistral.rs could not load {params.model_path}: {type(exc).__name__}: {engine_message(exc)}")
    if params.mtp_model:
        off = f'model_overrides[{params.alias!r}].speculative to {{"type": "off"}}'
        log(f"it was asked to draft with the MTP assistant {params.mtp_model}: set {off} to load without it")


def main(argv: list[str] | None = None) -> int:
    params = started("app.lanes.workers.mistralrs", api.LaneParams, argv)
    if params is None:
        return 3  # the server is gone
    if not Path(params.model_path).exists():
        log(f"the model is not there: {params.model_path}")
        return 4
    try:
        module, runner = load(params)
    except ImportError:
        log("mistralrs is not installed: pip install mistralrs")
        return 5
    except BaseException as exc:  # mistralrs raises ValueError, RuntimeError or a Rust panic on a bad model
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        _log_load_failure(params, exc)
        return 5
    if params.mtp_model:
        log(_speculation_line(params))
    # a thread per waiting call: a stream queued behind `max_seqs` running ones blocks in next() until it is
    # scheduled, and must not take the thread a running stream needs to read its tokens (threads start lazily)
    engine = Engine(runner, module, model=params.alias, threads=256)
    code = serve(make_app(engine))
    sys.stderr.flush()
    # skip interpreter teardown: a thread may still be inside the Runner, and the OS frees the model at once
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
