"""Ollama's API: /api/tags, /api/ps, /api/show, /api/chat, /api/generate, /api/embed, /api/embeddings.

Chat and generate stream NDJSON unless the body says `"stream": false`. `/api/version` is the admin
route (the same `{"version": ...}` shape). Errors here are Ollama-shaped: `{"error": "..."}` with the
status, and a `{"error": ...}` line once a stream has begun. A prompt longer than the lane's per-request
context is a 400. While a streamed answer's model loads, the client gets an empty piece (`"content": ""`,
`"done": false`) every second: NDJSON has no comment lines, and Ollama clients read an empty piece as
nothing to add.

Remote models (`NAME/MODEL`) are listed in /api/tags, described by /api/show (what is known here) and
served by chat, generate and embed; /api/ps lists only the engines loaded on this machine, so never them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, ModelNotFoundError, SwitchyardError
from app.lanes.lane import LaneState
from app.lanes.remote import AnyLane, RemoteLane
from app.library.catalog import ModelEntry
from app.runtime import Runtime
from app.server.keys import RUNTIME
from app.server.limits import check_prompt
from app.server.metrics import USAGE
from app.server.proxy import needs_loading, wait_loading
from app.server.remote_proxy import remote_for
from app.server.request_keys import MODEL
from app.server.translate_engine import has_vision, post, post_json, sse_chunks
from app.server.translate_ollama import (
    OllamaCall,
    OllamaTranslator,
    candidate_ids,
    chat_request,
    embed_inputs,
    generate_request,
    map_options,
    ndjson,
    now_iso,
    ollama_name,
    parse_keep_alive,
    remote_show,
    remote_tag,
    require_model,
    running,
    shorten,
    show,
    tag,
)
from app.server.validate import parse_body

log = logging.getLogger("switchyard.ollama")
routes = web.RouteTableDef()
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IGNORED_HEADER = "X-Switchyard-Ignored-Options"


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _guard(handler: _Handler) -> _Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except SwitchyardError as exc:
            return error_response(exc.status, exc.message)
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, "the request body is too large")
        except web.HTTPException:
            raise
        except Exception as exc:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(500, f"internal gateway error: {type(exc).__name__}: {exc}")

    return guarded


def resolve(rt: Runtime, name: str) -> ModelEntry:
    """The catalog entry for an Ollama name (`tiny` or `tiny:latest`)."""
    for mid in candidate_ids(name):
        try:
            return rt.catalog.get(mid)
        except ModelNotFoundError:
            continue
    known = ", ".join(ollama_name(i) for i in rt.catalog.ids()) or "none"
    raise ModelNotFoundError(f"model {name!r} not found; available models: {known}", param="model")


def _remote(request: web.Request, name: str) -> RemoteLane | None:
    """The remote lane an Ollama name (`home/tiny` or `home/tiny:latest`) names, if any: the one the
    remote listed (`tiny`, unless it lists `tiny:latest` itself), else the name as given."""
    lanes = [lane for mid in candidate_ids(name) if (lane := remote_for(request, mid)) is not None]
    return next((lane for lane in lanes if lane.listed), lanes[0] if lanes else None)


def _chat_entry(rt: Runtime, name: str, request: web.Request) -> ModelEntry:
    entry = resolve(rt, name)
    request[MODEL] = entry.id
    if entry.kind != "chat":
        raise BadRequestError(
            f"model {name!r} is an embedding model; it cannot chat or generate (use POST /api/embed)",
            param="model",
        )
    return entry


def _notes(ignored: tuple[str, ...], keep_alive: float | None) -> dict[str, str]:
    names = list(ignored)
    if names:
        log.info("ignored per-request options %s: the lane's settings decide them", ", ".join(names))
        return {IGNORED_HEADER: ", ".join(names)}
    return {}


async def _unload_if_asked(rt: Runtime, model_id: str, keep_alive: float | None) -> None:
    """`keep_alive: 0`: stop the lane once nothing else is using it; other values set the lane's idle TTL."""
    lane = rt.supervisor.lanes.get(model_id)
    if keep_alive is not None and keep_alive != 0:
        rt.supervisor.set_ttl(model_id, keep_alive)  # negative: keep loaded until something else needs room
        return
    if keep_alive != 0 or lane is None or lane.in_flight > 0:
        return
    try:
        await rt.supervisor.unload(model_id)
    except SwitchyardError as exc:
        log.info("could not unload %s after keep_alive 0: %s", model_id, exc.message)


# ---- listings ------------------------------------------------------------------------------------
@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    # Ollama lists language and embedding models only: voices and speech-to-text models are not for it
    listed = [tag(e) for e in rt.catalog.scan() if e.ok and e.kind in ("chat", "embedding")]
    local = {t["name"] for t in listed}
    remote = [remote_tag(m) for m in rt.remotes.listing() if m["kind"] in ("chat", "embedding")]
    listed += [t for t in remote if t["name"] not in local]
    return web.json_response({"models": listed})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    # what this machine holds in memory; a remote's models are loaded (or not) by the remote
    rt = request.app[RUNTIME]
    rows = []
    for lane in list(rt.supervisor.lanes.values()):
        if lane.state is not LaneState.READY:
            continue
        try:
            entry = rt.catalog.get(lane.model_id)
        except SwitchyardError:
            continue  # the file vanished or broke while the engine still runs
        rows.append(running(entry, lane.snapshot(), ttl_s=rt.supervisor.ttl_of(lane)))
    return web.json_response({"models": rows})


async def _show(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    name = require_model(body)
    if (remote := _remote(request, name)) is not None:
        request[MODEL] = remote.model_id
        if not remote.listed:
            raise ModelNotFoundError(
                f"model {name!r} is not among the models remote {remote.remote.name!r} listed at its last "
                "check; see GET /api/tags",
                param="model",
            )
        return web.json_response(remote_show(remote))
    entry = resolve(rt, name)
    request[MODEL] = entry.id
    return web.json_response(show(entry))


# ---- chat and generate ---------------------------------------------------------------------------
async def _chat(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    call = chat_request(parse_body(await request.read()))
    return await _run(request, call, kind="chat", started=started, empty=not call.openai["messages"])


async def _generate(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    body = parse_body(await request.read())
    call = generate_request(body)
    empty = not body.get("prompt") and not call.has_images
    return await _run(request, call, kind="generate", started=started, empty=empty)


async def _load_or_unload(
    request: web.Request, rt: Runtime, entry: ModelEntry, call: OllamaCall, kind: str
) -> web.Response:
    """An empty prompt loads the model (or, with keep_alive 0, unloads it), as Ollama does."""
    if call.keep_alive == 0:
        if entry.id in rt.supervisor.lanes:
            await rt.supervisor.unload(entry.id)
        reason = "unload"
    else:
        await rt.supervisor.load(entry.id)
        reason = "load"
    return _loaded(call, kind, reason)


def _loaded(call: OllamaCall, kind: str, reason: str) -> web.Response:
    out: dict[str, Any] = {"model": call.model, "created_at": now_iso(), "done": True, "done_reason": reason}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return web.json_response(out)


async def _run_remote(
    request: web.Request, lane: RemoteLane, call: OllamaCall, *, kind: str, started: float, empty: bool
) -> web.StreamResponse:
    """Chat or generate on a remote model: the same translation, sent to the remote with its key."""
    request[MODEL] = lane.model_id
    if (missing := lane.capability_error("chat")) is not None:
        raise missing
    if empty:
        return _loaded(call, kind, "load")  # nothing of ours to load: the remote holds its models
    headers = _notes(call.ignored, call.keep_alive)
    tr = OllamaTranslator(model=call.model, kind=kind, started=started)
    rt = request.app[RUNTIME]
    async with rt.remotes.use(lane):
        upstream = await post(rt.remotes.http, lane, call.path, call.openai)
        resp = await _relay(request, lane, upstream, call, tr, headers, None)
    prompt, completion = tr.usage.get("prompt_tokens"), tr.usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        request[USAGE] = (prompt, completion)
    return resp


async def _run(
    request: web.Request, call: OllamaCall, *, kind: str, started: float, empty: bool
) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    if (remote := _remote(request, call.model)) is not None:
        return await _run_remote(request, remote, call, kind=kind, started=started, empty=empty)
    entry = _chat_entry(rt, call.model, request)
    if empty:
        return await _load_or_unload(request, rt, entry, call, kind)
    headers = _notes(call.ignored, call.keep_alive)
    tr = OllamaTranslator(model=call.model, kind=kind, started=started)
    size = len(await request.read())  # kept by aiohttp: no second read
    resp: web.StreamResponse | None = None
    t_load = time.perf_counter()
    if call.stream and needs_loading(rt.supervisor, entry.id):
        resp = _ndjson_response(headers)
        ready = await wait_loading(
            request,
            rt.supervisor,
            entry.id,
            resp=resp,
            tick=lambda *_: ndjson([tr.waiting()]),
            fail=lambda exc: ndjson([{"error": exc.message}]),
        )
        if not ready:
            return resp
    try:
        resp = await _answer(request, rt, entry, call, tr, headers, resp, size=size, t_load=t_load)
    except SwitchyardError as exc:
        if resp is None:
            raise
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await resp.write(ndjson([{"error": exc.message}]))  # the stream said 200 already
        return resp
    prompt, completion = tr.usage.get("prompt_tokens"), tr.usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        request[USAGE] = (prompt, completion)  # tokens in/out for /metrics
    await _unload_if_asked(rt, entry.id, call.keep_alive)
    return resp


def _ndjson_response(headers: dict[str, str]) -> web.StreamResponse:
    return web.StreamResponse(headers={"Content-Type": "application/x-ndjson", **headers})


async def _answer(
    request: web.Request,
    rt: Runtime,
    entry: ModelEntry,
    call: OllamaCall,
    tr: OllamaTranslator,
    headers: dict[str, str],
    resp: web.StreamResponse | None,
    *,
    size: int,
    t_load: float,
) -> web.StreamResponse:
    http = rt.supervisor.http
    async with rt.supervisor.use(entry.id) as lane:
        tr.load_s = time.perf_counter() - t_load
        if call.has_images and not await has_vision(http, lane):
            raise BadRequestError(
                f"model {call.model!r} cannot read images: its engine has no vision projector (mmproj) "
                "loaded, and Switchyard does not load projectors yet; send text only",
                param="images",
            )
        body = {**call.openai, "model": entry.id}
        if rt.settings.check_prompt_length:
            route = "chat" if call.path == "/v1/chat/completions" else "completions"
            await check_prompt(http, lane, body, body_bytes=size, route=route)
        upstream = await post(http, lane, call.path, body)
        return await _relay(request, lane, upstream, call, tr, headers, resp)


async def _relay(
    request: web.Request,
    lane: AnyLane,
    upstream: aiohttp.ClientResponse,
    call: OllamaCall,
    tr: OllamaTranslator,
    headers: dict[str, str],
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    """The engine's OpenAI answer, translated to Ollama's: streamed as NDJSON, or whole."""
    try:
        if call.stream:
            return await _stream(request, lane, upstream, tr, headers, resp)
        async with contextlib.aclosing(sse_chunks(upstream, lane)) as chunks:
            async for chunk in chunks:
                tr.feed(chunk)
        answer = web.json_response(tr.whole(), headers=headers)
        await answer.prepare(request)  # answer first; an unload below must not delay it
        await answer.write_eof()
        return answer
    finally:
        upstream.close()


async def _stream(
    request: web.Request,
    lane: AnyLane,
    upstream: aiohttp.ClientResponse,
    tr: OllamaTranslator,
    headers: dict[str, str],
    resp: web.StreamResponse | None = None,
) -> web.StreamResponse:
    if resp is None:
        resp = _ndjson_response(headers)
        await resp.prepare(request)
    try:
        try:
            async with contextlib.aclosing(sse_chunks(upstream, lane)) as chunks:
                async for chunk in chunks:
                    objs = tr.feed(chunk)
                    if objs:
                        await resp.write(ndjson(objs))
            await resp.write(ndjson(tr.final()))
        except SwitchyardError as exc:  # the status is sent already: an error line, as Ollama does
            await resp.write(ndjson([{"error": exc.message}]))
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client went away mid-stream; closing the upstream request")
    return resp


# ---- embeddings ----------------------------------------------------------------------------------
def _embed_entry(rt: Runtime, name: str, request: web.Request) -> ModelEntry | RemoteLane:
    if (remote := _remote(request, name)) is not None:
        request[MODEL] = remote.model_id
        if (missing := remote.capability_error("embeddings")) is not None:
            raise missing
        return remote
    entry = resolve(rt, name)
    request[MODEL] = entry.id
    if entry.kind != "embedding":
        raise BadRequestError(
            f"model {name!r} is a generative model, not an embedding model (its GGUF has no pooling "
            "type); use an embedding model for /api/embed",
            param="model",
        )
    return entry


async def _embed_vectors(
    rt: Runtime, entry: ModelEntry | RemoteLane, inputs: list[str], *, normalize: bool
) -> tuple[list[list[float]], int | None, float]:
    """(vectors in input order, prompt tokens, seconds spent waiting for the lane)."""
    body: dict[str, Any] = {"model": entry.id, "input": inputs, "encoding_format": "float"}
    if not normalize:
        body["embd_normalize"] = -1  # llama.cpp: raw vectors, as Ollama's legacy endpoint returns
    t_load = time.perf_counter()
    if isinstance(entry, RemoteLane):
        async with rt.remotes.use(entry) as remote:
            data = await post_json(rt.remotes.http, remote, "/v1/embeddings", body)
            load_s = 0.0
    else:
        async with rt.supervisor.use(entry.id) as lane:
            load_s = time.perf_counter() - t_load
            data = await post_json(rt.supervisor.http, lane, "/v1/embeddings", body)
    rows = sorted(data.get("data") or [], key=lambda d: d.get("index", 0))
    usage = data.get("usage") or {}
    tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    return [list(r["embedding"]) for r in rows], tokens, load_s


async def _embed(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    name = require_model(body)
    inputs = embed_inputs(body)
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise BadRequestError("'dimensions' must be a positive integer", param="dimensions")
    _, ignored = map_options(body.get("options"))
    keep = parse_keep_alive(body.get("keep_alive"))
    entry = _embed_entry(rt, name, request)
    vectors, tokens, load_s = await _embed_vectors(rt, entry, inputs, normalize=True)
    out: dict[str, Any] = {
        "model": name,
        "embeddings": [shorten(v, dims) for v in vectors],
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": int(load_s * 1e9),
    }
    if tokens is not None:
        out["prompt_eval_count"] = tokens
    resp = web.json_response(out, headers=_notes(tuple(ignored), keep))
    await resp.prepare(request)
    await resp.write_eof()
    await _unload_if_asked(rt, entry.id, keep)
    return resp


async def _embeddings(request: web.Request) -> web.StreamResponse:
    """The older endpoint: one `prompt`, one raw (not normalized) `embedding`."""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    name = require_model(body)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise BadRequestError("field 'prompt' must be a string", param="prompt")
    entry = _embed_entry(rt, name, request)
    if not prompt:
        return web.json_response({"embedding": []})
    vectors, _, _ = await _embed_vectors(rt, entry, [prompt], normalize=False)
    return web.json_response({"embedding": vectors[0] if vectors else []})


routes.post("/api/show")(_guard(_show))
routes.post("/api/chat")(_guard(_chat))
routes.post("/api/generate")(_guard(_generate))
routes.post("/api/embed")(_guard(_embed))
routes.post("/api/embeddings")(_guard(_embeddings))
