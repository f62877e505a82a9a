"""Requests for `NAME/MODEL` passed through to remote NAME: the gateway's side of a remote lane.

What changes on the way: the body's `model` becomes the remote's own name for the model, and the
Authorization header is the remote's key (the local client's key never leaves this machine; nothing of the
client's headers is forwarded). Answers and streams come back as bytes, unbuffered; a client that goes away
closes the upstream request. The remote's errors are re-wrapped in our envelope with `source: remote`; a
refused key is a 502 `remote_auth_failed` (the client's own key was fine), a remote that does not answer a
503 `remote_unreachable`, both naming the remote and what to do.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, SwitchyardError
from app.lanes.remote import RemoteLane
from app.server.keys import RUNTIME
from app.server.metrics import USAGE, usage_from
from app.server.translate_engine import rewrap_error

log = logging.getLogger("switchyard.remote")
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}


def remote_for(request: web.Request, model: str) -> RemoteLane | None:
    """The remote lane for `model`, or None: a local model of the same id always wins."""
    rt = request.app[RUNTIME]
    if rt.catalog.find(model) is not None:
        return None
    return rt.remotes.resolve(model)


def refuse_remote(request: web.Request, model: str, *, surface: str) -> None:
    """The surfaces not yet routed to remotes (Anthropic, Responses) say so instead of "not found"."""
    if (lane := remote_for(request, model)) is not None:
        raise BadRequestError(
            f"model {model!r} is on remote {lane.remote.name!r}; the {surface} does not reach remote models "
            "yet: use POST /v1/chat/completions (or Ollama's /api/chat) for it",
            param="model",
        )


def keep_header(name: str) -> bool:
    low = name.lower()
    return low not in _HOP and not low.startswith("access-control-")


async def send(lane: RemoteLane, http: aiohttp.ClientSession, path: str, body: bytes, ctype: str) -> Any:
    """POST to the remote. A pooled connection it closed while idle is retried once; a remote that cannot
    be reached at all is a 503 (nothing was sent); a connection that breaks after sending is a 502."""
    headers = {"Content-Type": ctype, **lane.auth_headers()}
    for attempt in (1, 2):
        try:
            return await http.post(lane.base_url + path, data=body, headers=headers, timeout=_TIMEOUT)
        except aiohttp.ClientConnectorError as exc:
            raise lane.broken(exc) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if attempt == 1:
                log.debug("remote connection was stale (%s); retrying once", exc)
                continue
            raise lane.broken() from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise lane.broken() from exc
    raise AssertionError("unreachable")


def remote_error(lane: RemoteLane, status: int, data: bytes) -> SwitchyardError | web.Response:
    """A remote's error answer: its key refused -> our 502 (and the remote is marked so); anything else
    re-wrapped with its status, message, type and code."""
    if status in (401, 403):
        return lane.remote.auth_failed(status)
    who = f"remote {lane.remote.name!r} (for {lane.model_id!r})"
    return rewrap_error(status, data, who=who, source="remote")


def json_body(lane: RemoteLane, body: dict[str, Any]) -> bytes:
    """The request as the remote must see it: its own name for the model."""
    return json.dumps({**body, "model": lane.served_name}).encode()


async def forward_remote(
    request: web.Request, lane: RemoteLane, *, capability: str, path: str, body: dict[str, Any]
) -> web.StreamResponse:
    """A JSON request (chat, completions, embeddings) through to the remote, streams included."""
    from app.server.proxy import _stream  # the same unbuffered pass-through a local lane's stream gets

    if (missing := lane.capability_error(capability)) is not None:
        raise missing
    rt = request.app[RUNTIME]
    async with rt.remotes.use(lane):
        upstream = await send(lane, rt.remotes.http, path, json_body(lane, body), "application/json")
        try:
            if "text/event-stream" in upstream.headers.get("Content-Type", "") and upstream.status < 400:
                return await _stream(request, upstream, lane)
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, OSError) as exc:
                raise lane.broken() from exc
            if upstream.status >= 400:
                failed = remote_error(lane, upstream.status, data)
                if isinstance(failed, SwitchyardError):
                    raise failed
                return failed
            if (usage := usage_from(data)) is not None:
                request[USAGE] = usage
            headers = {k: v for k, v in upstream.headers.items() if keep_header(k)}
            return web.Response(body=data, status=upstream.status, headers=headers)
        finally:
            upstream.close()  # an unfinished answer drops the socket, so the remote stops generating


async def call_remote(
    request: web.Request, lane: RemoteLane, *, capability: str, path: str, body: bytes, content_type: str
) -> web.Response:
    """A non-streamed request (images, speech) through to the remote; JSON bodies only."""
    if (missing := lane.capability_error(capability)) is not None:
        raise missing
    if not content_type.startswith("application/json"):
        raise BadRequestError(
            f"{path} with a multipart body is not passed to remote models yet ({lane.model_id!r} is on "
            f"remote {lane.remote.name!r}); call the remote directly",
            param="model",
        )
    rt = request.app[RUNTIME]
    parsed = json.loads(body)
    async with rt.remotes.use(lane):
        upstream = await send(lane, rt.remotes.http, path, json_body(lane, parsed), content_type)
        try:
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, OSError) as exc:
                raise lane.broken() from exc
            if upstream.status >= 400:
                failed = remote_error(lane, upstream.status, data)
                if isinstance(failed, SwitchyardError):
                    raise failed
                return failed
            headers = {k: v for k, v in upstream.headers.items() if keep_header(k)}
            return web.Response(body=data, status=upstream.status, headers=headers)
        finally:
            upstream.close()
