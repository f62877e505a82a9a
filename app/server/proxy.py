"""Pass a request through to the lane's engine: bytes in, bytes out, streams unbuffered.

When the client goes away the upstream request is closed, so llama.cpp frees the slot.
When the engine dies mid-request the client gets a 502 (or, mid-stream, an error event).
One rewrite: a named tool_choice becomes the form llama.cpp enforces (see pin_named_tool_choice).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError
from app.lanes.lane import Lane, crashed_error
from app.server.keys import RUNTIME
from app.server.limits import check_prompt
from app.server.metrics import FIRST_BYTE, USAGE, usage_from
from app.server.translate_engine import pin_named_tool_choice
from app.server.validate import check, parse_body

log = logging.getLogger("switchyard.proxy")
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}
_KIND_FOR_ROUTE = {"chat": "chat", "completions": "chat", "embeddings": "embedding"}


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
    request["model"] = model
    if route == "chat" and (pinned := pin_named_tool_choice(body)) is not None:
        raw = json.dumps(pinned).encode()  # the one rewrite: llama.cpp would drop a named tool_choice
    rt = request.app[RUNTIME]
    entry = rt.catalog.get(model)
    if entry.kind != _KIND_FOR_ROUTE[route]:
        raise _kind_error(model, entry.kind, route)
    headers = {"Content-Type": "application/json"}
    if body.get("stream") is True:
        # llama.cpp closes the connection after a streamed answer although it offers keep-alive; asking
        # for close keeps that socket out of the pool, where the next request would find it dead
        headers["Connection"] = "close"
    async with rt.supervisor.use(model) as lane:
        if route != "embeddings" and rt.settings.check_prompt_length:
            await check_prompt(rt.supervisor.http, lane, body, body_bytes=len(raw), route=route)
        upstream = await _send(rt.supervisor.http, lane, path, raw, headers)
        try:
            ctype = upstream.headers.get("Content-Type", "")
            if "text/event-stream" in ctype:
                return await _stream(request, upstream, lane)
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, OSError) as exc:
                await asyncio.sleep(0.05)
                raise crashed_error(lane) from exc
            if upstream.status >= 400:
                return _engine_error(upstream.status, data, model)
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
    """Re-wrap an engine's error answer in our envelope, keeping its message and status."""
    message, etype, code = (
        data.decode("utf-8", "replace").strip() or f"engine answered HTTP {status}",
        None,
        None,
    )
    try:
        err = json.loads(data).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            etype, code = err.get("type"), err.get("code")
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    body = {
        "error": {
            "message": f"the engine for {model!r} refused the request: {message}",
            "type": etype
            if isinstance(etype, str)
            else "invalid_request_error"
            if status < 500
            else "engine_error",
            "param": None,
            "code": code if isinstance(code, str) else f"engine_http_{status}",
            "source": "engine",
        }
    }
    return web.json_response(body, status=status)


async def _stream(request: web.Request, upstream: aiohttp.ClientResponse, lane: Lane) -> web.StreamResponse:
    resp = web.StreamResponse(status=upstream.status)
    resp.headers["Content-Type"] = upstream.headers.get("Content-Type", "text/event-stream")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    await resp.prepare(request)
    prev = last = b""
    try:
        # the first chunk is read apart so the loop pays nothing for the time-to-first-byte stamp
        if last := await upstream.content.readany():
            await resp.write(last)
            request[FIRST_BYTE] = time.perf_counter()
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
            prev, last = last, chunk  # the usage is in the last events: keep two chunks, parse none
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("client went away mid-stream; closing the upstream request")
        return resp
    except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError):
        await asyncio.sleep(0.05)
        err = crashed_error(lane)
        try:
            await resp.write(f"data: {json.dumps(err.envelope())}\n\n".encode())
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return resp
    if (usage := usage_from(prev + last)) is not None:
        request[USAGE] = usage
    try:
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    return resp
