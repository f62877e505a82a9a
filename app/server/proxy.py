"""Pass a request through to the lane's engine: bytes in, bytes out, streams unbuffered.

When the client goes away the upstream request is closed, so llama.cpp frees the slot.
When the engine dies mid-request the client gets a 502 (or, mid-stream, an error event).
One rewrite: a named tool_choice becomes the form llama.cpp enforces (see pin_named_tool_choice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, SwitchyardError
from app.lanes.lane import Lane, crashed_error
from app.lanes.remote import RemoteLane
from app.server.keys import RUNTIME
from app.server.limits import check_prompt
from app.server.metrics import FIRST_BYTE, SENT_STATUS, USAGE, usage_from
from app.server.remote_proxy import forward_remote, remote_for
from app.server.request_keys import MODEL
from app.server.translate_engine import pin_named_tool_choice, rewrap_error
from app.server.validate import check, parse_body

log = logging.getLogger("switchyard.proxy")
LOADING_COMMENT_S = 1.0  # how often a waiting stream hears that its model is still loading
LOAD_FAILED = "switchyard.load_failed"
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}
_KIND_FOR_ROUTE = {"chat": "chat", "completions": "chat", "embeddings": "embedding"}
_CAPABILITY_FOR_ROUTE = {"chat": "chat", "completions": "completions", "embeddings": "embeddings"}


def _kind_error(model: str, kind: str, route: str) -> BadRequestError:
    if kind == "embedding":
        return BadRequestError(
            f"model {model!r} is an embedding model; call POST /v1/embeddings with it", param="model"
        )
    return BadRequestError(
        f"model {model!r} is a generative model, not an embedding model (its GGUF has no pooling type); "
        "use an embedding model for /v1/embeddings",
        param="model",
    )


async def forward(request: web.Request, *, route: str, path: str) -> web.StreamResponse:
    raw = await request.read()
    body = parse_body(raw)
    model = check(body, route)
    request[MODEL] = model
    if route == "chat" and (pinned := pin_named_tool_choice(body)) is not None:
        raw = json.dumps(pinned).encode()  # the one rewrite: llama.cpp would drop a named tool_choice
    rt = request.app[RUNTIME]
    if (remote := remote_for(request, model)) is not None:  # NAME/MODEL on a registered remote
        cap = _CAPABILITY_FOR_ROUTE[route]
        return await forward_remote(request, remote, capability=cap, path=path, body=body)
    entry = rt.catalog.get(model)
    if entry.format == "gguf" and entry.kind in ("chat", "embedding"):
        if entry.kind != _KIND_FOR_ROUTE[route]:
            raise _kind_error(model, entry.kind, route)
    elif (missing := rt.supervisor.capability_error(entry, _CAPABILITY_FOR_ROUTE[route])) is not None:
        raise missing  # a voice asked for chat, a transcriber for embeddings: name the lanes that can
    headers = {"Content-Type": "application/json"}
    resp: web.StreamResponse | None = None
    if body.get("stream") is True:
        # llama.cpp closes the connection after a streamed answer although it offers keep-alive; asking
        # for close keeps that socket out of the pool, where the next request would find it dead
        headers["Connection"] = "close"
        lane_now = rt.supervisor.lanes.get(model)
        if lane_now is None or not lane_now.available:
            resp = await _wait_loading(request, rt.supervisor, model)
            if request.get(LOAD_FAILED):
                return resp
    try:
        return await _forward_ready(request, rt, model, route, path, body, raw, headers, resp)
    except SwitchyardError as exc:
        if resp is None:
            raise
        await _write_event_error(resp, exc)  # the stream already answered 200: the error goes in it
        return resp


async def _forward_ready(
    request: web.Request,
    rt: Any,
    model: str,
    route: str,
    path: str,
    body: dict[str, Any],
    raw: bytes,
    headers: dict[str, str],
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    async with rt.supervisor.use(model) as lane:
        if route != "embeddings" and rt.settings.check_prompt_length:
            await check_prompt(rt.supervisor.http, lane, body, body_bytes=len(raw), route=route)
        upstream = await _send(rt.supervisor.http, lane, path, raw, headers)
        try:
            ctype = upstream.headers.get("Content-Type", "")
            if "text/event-stream" in ctype:
                return await _stream(request, upstream, lane, resp)
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, OSError) as exc:
                await asyncio.sleep(0.05)
                raise crashed_error(lane) from exc
            if upstream.status >= 400:
                answer = _engine_error(upstream.status, data, model)
                if resp is not None:  # headers went out with the loading comments
                    assert answer.body is not None
                    await resp.write(b"data: " + bytes(answer.body) + b"\n\n")  # type: ignore[arg-type]
                    return resp
                return answer
            if (usage := usage_from(data)) is not None:
                request[USAGE] = usage
            headers = {k: v for k, v in upstream.headers.items() if _keep_header(k)}
            return web.Response(body=data, status=upstream.status, headers=headers)
        finally:
            # closing (not releasing) an unfinished answer drops the socket, so the engine stops work for us
            upstream.close()


async def _send(
    http: aiohttp.ClientSession, lane: Lane, path: str, raw: bytes, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    """POST to the engine. A pooled connection the engine closed while idle fails before the engine read
    anything, so that one case is retried once on a fresh connection; a dead engine is a 502."""
    for attempt in (1, 2):
        try:
            return await http.post(
                lane.base_url + path,
                data=raw,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            await asyncio.sleep(0)  # let the lane see an exit first, if the engine died
            if (
                attempt == 1
                and lane.available
                and lane.proc is not None
                and lane.proc.proc.returncode is None
            ):
                log.debug("engine connection was stale (%s); retrying once", exc)
                continue
            await asyncio.sleep(0.05)  # let the lane see the exit so the error names it
            raise crashed_error(lane) from exc
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)
            raise crashed_error(lane) from exc
    raise AssertionError("unreachable")


def _keep_header(name: str) -> bool:
    # the engine's own CORS answers are not ours to give: the gateway decides who may call it
    low = name.lower()
    return low not in _HOP and not low.startswith("access-control-")


def _engine_error(status: int, data: bytes, model: str) -> web.Response:
    return rewrap_error(status, data, who=f"the engine for {model!r}", source="engine")


def sse_response(status: int = 200) -> web.StreamResponse:
    resp = web.StreamResponse(status=status)
    resp.headers["Content-Type"] = "text/event-stream"
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    return resp


async def _write_event_error(resp: web.StreamResponse, exc: SwitchyardError) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await resp.write(f"data: {json.dumps(exc.envelope())}\n\n".encode())


def needs_loading(supervisor: Any, model: str) -> bool:
    """Whether a request for `model` would wait for its lane to start (or restart)."""
    lane = supervisor.lanes.get(model)
    return lane is None or not lane.available


def loading_comment(model: str, phase: str, seconds: float) -> bytes:
    return f": switchyard: loading {model} ({phase}, {seconds:.0f} s)\n\n".encode()


async def wait_loading(
    request: web.Request,
    supervisor: Any,
    model: str,
    *,
    resp: web.StreamResponse,
    fail: Callable[[SwitchyardError], bytes],
    tick: Callable[[str, str, float], bytes] = loading_comment,
) -> bool:
    """Start `model`'s lane while `resp` (prepared here if it is not yet) hears `tick(model, phase,
    seconds)` every LOADING_COMMENT_S, so a streaming client neither times out nor waits blind.

    True once the lane is ready. False when the start failed (`fail(exc)` was written: the surface's own
    error event) or the client went away (the start goes on for the next request)."""
    if not resp.prepared:
        await resp.prepare(request)
    start = asyncio.ensure_future(supervisor.ensure(model))
    start.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
    t0 = time.monotonic()
    try:
        while True:
            lane = supervisor.lanes.get(model)
            phase = lane.state.value if lane is not None else "queued"
            await resp.write(tick(model, phase, time.monotonic() - t0))
            done, _ = await asyncio.wait({start}, timeout=LOADING_COMMENT_S)
            if done:
                break
        start.result()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        return False
    except SwitchyardError as exc:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await resp.write(fail(exc))
        return False
    return True


async def _wait_loading(request: web.Request, supervisor: Any, model: str) -> web.StreamResponse:
    """The OpenAI pass-through's wait: comments, then `data: {error envelope}` if the start failed."""
    resp = sse_response()
    ready = await wait_loading(
        request, supervisor, model, resp=resp, fail=lambda e: f"data: {json.dumps(e.envelope())}\n\n".encode()
    )
    if not ready:
        request[LOAD_FAILED] = True
    return resp


_DONE = b"data: [DONE]\n\n"


def _mark_sent(request: web.Request, resp: web.StreamResponse, tail: bytes) -> None:
    """Record a stream as answered in full, with the usage its last events carry (for /metrics)."""
    if (usage := usage_from(tail)) is not None:
        request[USAGE] = usage
    request[SENT_STATUS] = resp.status


async def _stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    lane: Lane | RemoteLane,
    resp: web.StreamResponse | None = None,
) -> web.StreamResponse:
    if resp is None:
        resp = sse_response(upstream.status)
        resp.headers["Content-Type"] = upstream.headers.get("Content-Type", "text/event-stream")
        await resp.prepare(request)
    prev = last = b""
    try:
        # the first chunk is read apart so the loop pays nothing for the time-to-first-byte stamp
        if last := await upstream.content.readany():
            await resp.write(last)
            request[FIRST_BYTE] = time.perf_counter()
            if last.endswith(_DONE):
                _mark_sent(request, resp, last)
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
            prev, last = last, chunk  # the usage is in the last events: keep two chunks, parse none
            if chunk.endswith(_DONE):
                # the answer is whole once its terminal event is out: a client that hangs up now, while
                # the engine is still closing its side, has read everything (counted 200, not 499)
                _mark_sent(request, resp, prev + last)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client went away mid-stream; closing the upstream request")
        return resp
    except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError):
        await asyncio.sleep(0.05)
        err = lane.broken()
        try:
            await resp.write(f"data: {json.dumps(err.envelope())}\n\n".encode())
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return resp
    _mark_sent(request, resp, prev + last)
    try:
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    return resp
