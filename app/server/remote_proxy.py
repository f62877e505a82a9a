"""Requests for `NAME/MODEL` passed through to remote NAME: the gateway's side of a remote lane.

What changes on the way: the body's `model` becomes the remote's own name for the model (in a multipart
upload, its `model` field: the form is rebuilt around the same file), and the Authorization header is the
remote's key (the local client's key never leaves this machine; nothing of the client's headers is
forwarded). Answers and streams come back as bytes, unbuffered; a client that goes away closes the
upstream request. The remote's errors are re-wrapped in our envelope with `source: remote`; a
refused key is a 502 `remote_auth_failed` (the client's own key was fine), a remote that does not answer a
503 `remote_unreachable`, both naming the remote and what to do.

The translated surfaces (Anthropic, Responses) hold a lane through `hold`: the remote's for a remote model,
the supervisor's (started just in time) otherwise, each with the HTTP session that reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import SwitchyardError
from app.lanes.remote import AnyLane, RemoteLane
from app.server.keys import RUNTIME
from app.server.metrics import USAGE, usage_from
from app.server.multipart import form_parts, with_field
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


@dataclass(frozen=True)
class Held:
    """A lane held for one request, and the HTTP session that reaches it."""

    lane: AnyLane
    http: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def hold(request: web.Request, model: str, *, remote: RemoteLane | None) -> AsyncIterator[Held]:
    """Hold `remote` (re-checked first if it was not ready) or, with None, start and hold `model`'s local
    lane; either counts as in flight until the block ends."""
    rt = request.app[RUNTIME]
    if remote is not None:
        async with rt.remotes.use(remote) as lane:
            yield Held(lane, rt.remotes.http)
    else:
        async with rt.supervisor.use(model) as local:
            yield Held(local, rt.supervisor.http)


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


async def renamed_body(lane: RemoteLane, body: bytes, content_type: str) -> tuple[bytes, str]:
    """(body, content type) as the remote must see them: JSON with its own model name, or a multipart
    upload rebuilt with its `model` field set to that name."""
    if not content_type.startswith("multipart/form-data"):
        return json_body(lane, json.loads(body)), content_type
    # parsing an upload of many megabytes takes a while (about a second for 25 MB): off the event loop
    parts = await asyncio.to_thread(form_parts, body, content_type)
    return await with_field(parts, name="model", value=lane.served_name)


async def call_remote(
    request: web.Request, lane: RemoteLane, *, capability: str, path: str, body: bytes, content_type: str
) -> web.Response:
    """A non-streamed request (images, speech, a transcription's upload) through to the remote."""
    if (missing := lane.capability_error(capability)) is not None:
        raise missing
    rt = request.app[RUNTIME]
    payload, ctype = await renamed_body(lane, body, content_type)
    async with rt.remotes.use(lane):
        upstream = await send(lane, rt.remotes.http, path, payload, ctype)
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
