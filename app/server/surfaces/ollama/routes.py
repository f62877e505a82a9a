"""Ollama's API: /api/version, /api/tags, /api/ps, /api/show, /api/chat, /api/generate, /api/embed and
/api/embeddings.

Chat and generate stream NDJSON unless the body says `"stream": false`. `/api/version` answers
`{"version": ...}` (Switchyard's; Ollama clients read it to see a server is there). Errors here are
Ollama-shaped: `{"error": "..."}` with the status, and a `{"error": ...}` line once a stream has begun. A
prompt longer than the lane's per-request context is a 400. While a streamed answer's model loads, the
client gets an empty piece (`"content": ""`, `"done": false`) every second: NDJSON has no comment lines,
and Ollama clients read an empty piece as nothing to add.

Remote models (`NAME/MODEL`) are listed in /api/tags, described by /api/show (what is known here) and
served by chat, generate and embed; /api/ps lists only the engines loaded on this machine, so never them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from app import __version__
from app.core.errors import BadRequestError, ModelNotFoundError, SwitchyardError
from app.lanes.lane import LaneState
from app.lanes.lane_requests import adapter_base
from app.lanes.remote.lane import RemoteLane
from app.library.catalog import ModelEntry
from app.runtime import Runtime
from app.server.gateway.model_limits import limits_of, plan_for_listing
from app.server.gateway.runner import Call, run
from app.server.keys import GATEWAY, RUNTIME
from app.server.request_keys import MODEL
from app.server.surfaces.ollama.translate import (
    OllamaCall,
    OllamaTranslator,
    candidate_ids,
    chat_request,
    embed_inputs,
    generate_request,
    map_options,
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
from app.server.surfaces.openai.validate import parse_body

log = logging.getLogger("switchyard.ollama")
routes = web.RouteTableDef()
IGNORED_HEADER = "X-Switchyard-Ignored-Options"
OLLAMA_KINDS = ("chat", "embedding")  # what Ollama's API lists and offers


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


def resolve(rt: Runtime, name: str) -> ModelEntry:
    """The catalog entry for an Ollama name (`tiny` or `tiny:latest`)."""
    for mid in candidate_ids(name):
        try:
            return rt.catalog.get(mid)
        except ModelNotFoundError:
            continue
    # the names /api/tags lists, no others: a model offered here must be one the client can list
    known = ", ".join(ollama_name(e.id) for e in rt.catalog.servable() if listed(e)) or "none"
    raise ModelNotFoundError(f"model {name!r} not found; available models: {known}", param="model")


def listed(entry: ModelEntry) -> bool:
    """Whether Ollama's API lists `entry`: language and embedding models (Ollama has no voices,
    speech-to-text or rerankers)."""
    return entry.ok and entry.kind in OLLAMA_KINDS


def _remote(request: web.Request, name: str) -> RemoteLane | None:
    """The remote lane an Ollama name (`home/tiny` or `home/tiny:latest`) names, if any: the one the
    remote listed (`tiny`, unless it lists `tiny:latest` itself), else the name as given."""
    lanes = [
        lane for mid in candidate_ids(name) if (lane := request.app[GATEWAY].remote_for(mid)) is not None
    ]
    return next((lane for lane in lanes if lane.listed), lanes[0] if lanes else None)


def model_id_for(request: web.Request, name: str) -> str:
    """The id an Ollama name (`tiny`, `tiny:latest`, `home/tiny`) stands for: a remote's model, else a local
    one (a local model of the same id wins)."""
    if (remote := _remote(request, name)) is not None:
        return remote.model_id
    rt = request.app[RUNTIME]
    for mid in candidate_ids(name):  # `BASE+ADAPTER` (or `BASE+ADAPTER:latest`): the gateway maps it
        if rt.catalog.find(mid) is None and adapter_base(mid, rt.settings) is not None:
            return mid
    return resolve(rt, name).id


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
    shown = [tag(e) for e in rt.catalog.listing() if listed(e)]
    local = {t["name"] for t in shown}
    remote = [remote_tag(m) for m in rt.remotes.listing() if m["kind"] in OLLAMA_KINDS]
    shown += [t for t in remote if t["name"] not in local]
    return web.json_response({"models": shown})


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


@routes.post("/api/show")
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
    doc = show(entry, rt.settings)
    slots = request.app[GATEWAY].planned
    await plan_for_listing(slots, [entry], budget_s=60.0)  # one model: plan it now, however long
    if (limits := limits_of(rt, entry, rt.supervisor.lanes.get(entry.id), slots=slots)) is not None:
        # as a Modelfile says it: num_ctx is what one request may hold (model_info keeps the trained window)
        doc["parameters"] = f"num_ctx {limits['context_length']}\nnum_predict {limits['max_output']}"
    return web.json_response(doc)


# ---- chat and generate ---------------------------------------------------------------------------
@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    raw = await request.read()
    call = chat_request(parse_body(raw))
    return await _run(
        request, call, kind="chat", started=started, size=len(raw), empty=not call.openai["messages"]
    )


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    raw = await request.read()
    body = parse_body(raw)
    call = generate_request(body)
    empty = not body.get("prompt") and not call.has_images
    return await _run(request, call, kind="generate", started=started, size=len(raw), empty=empty)


async def _run(
    request: web.Request, call: OllamaCall, *, kind: str, started: float, size: int, empty: bool
) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    model = model_id_for(request, call.model)
    request[MODEL] = model
    if empty:
        return await _load_or_unload(request, model, call, kind)
    tr = OllamaTranslator(model=call.model, kind=kind, started=started)
    run_call = Call(
        model=model,
        body=call.openai,
        stream=call.stream,
        size=size,
        path=call.path,
        has_images=call.has_images,
        param="images" if call.has_images else None,
        headers=_notes(call.ignored, call.keep_alive),
    )
    resp = await run(request, run_call, tr)
    if model in rt.supervisor.lanes:
        await _unload_if_asked(rt, model, call.keep_alive)
    return resp


async def _load_or_unload(request: web.Request, model: str, call: OllamaCall, kind: str) -> web.Response:
    """An empty prompt loads the model (or, with keep_alive 0, unloads it), as Ollama does; a remote's
    models are the remote's to load."""
    gw = request.app[GATEWAY]
    to = await gw.resolve(model, "chat")
    sup = request.app[RUNTIME].supervisor
    if to.remote is not None:
        reason = "load"
    elif call.keep_alive == 0:
        if to.model in sup.lanes:
            await sup.unload(to.model)
        reason = "unload"
    else:
        await sup.load(to.model)
        reason = "load"
    out: dict[str, Any] = {"model": call.model, "created_at": now_iso(), "done": True, "done_reason": reason}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return web.json_response(out)


# ---- embeddings ----------------------------------------------------------------------------------
async def _embed_vectors(
    request: web.Request, model: str, inputs: list[str], *, normalize: bool
) -> tuple[list[list[float]], int | None, float]:
    """(vectors in input order, prompt tokens, seconds spent waiting for the lane)."""
    gw = request.app[GATEWAY]
    to = await gw.resolve(model, "embeddings")
    body: dict[str, Any] = {"input": inputs, "encoding_format": "float"}
    if not normalize:
        body["embd_normalize"] = -1  # llama.cpp: raw vectors, as Ollama's legacy endpoint returns
    t_load = time.perf_counter()
    async with gw.hold(to) as target:
        load_s = 0.0 if to.remote is not None else time.perf_counter() - t_load
        data = await gw.post_json(target, "/v1/embeddings", body)
    rows = sorted(data.get("data") or [], key=lambda d: d.get("index", 0))
    usage = data.get("usage") or {}
    tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    return [list(r["embedding"]) for r in rows], tokens, load_s


@routes.post("/api/embed")
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
    model = request[MODEL] = model_id_for(request, name)
    vectors, tokens, load_s = await _embed_vectors(request, model, inputs, normalize=True)
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
    await _unload_if_asked(rt, model, keep)
    return resp


@routes.post("/api/embeddings")
async def _embeddings(request: web.Request) -> web.StreamResponse:
    """The older endpoint: one `prompt`, one raw (not normalized) `embedding`."""
    body = parse_body(await request.read())
    name = require_model(body)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise BadRequestError("field 'prompt' must be a string", param="prompt")
    model = request[MODEL] = model_id_for(request, name)
    # a chat model is refused even for an empty prompt
    await request.app[GATEWAY].resolve(model, "embeddings")
    if not prompt:
        return web.json_response({"embedding": []})
    vectors, _, _ = await _embed_vectors(request, model, [prompt], normalize=False)
    return web.json_response({"embedding": vectors[0] if vectors else []})
