"""One request to a lane that is not a token stream (audio, images): resolve the model, check that its
lane can do what the route asks, start the lane just in time, pass the body through, pass the answer back.

A `NAME/MODEL` of a registered remote goes to that remote instead (app/server/remote_proxy.py). An engine
whose API differs from OpenAI's gets the request in its own shape (`EngineShape`: sd-server's images).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError
from app.server.keys import RUNTIME
from app.server.remote_proxy import call_remote, remote_for
from app.server.request_keys import MODEL

_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}


@dataclass(frozen=True)
class EngineShape:
    """The request in the shape one engine kind reads, and how to turn its answer back into OpenAI's."""

    engine: str  # the lane id it applies to
    body: bytes
    content_type: str
    answer: Callable[[int, bytes], web.Response]


def need_model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequestError("field 'model' must name a model from GET /v1/models", param="model")
    return value


async def call_lane(
    request: web.Request,
    *,
    model: str,
    capability: str,
    path: str,
    body: bytes,
    content_type: str,
    shape: EngineShape | None = None,
) -> web.Response:
    rt = request.app[RUNTIME]
    request[MODEL] = model
    if (remote := remote_for(request, model)) is not None:
        return await call_remote(
            request, remote, capability=capability, path=path, body=body, content_type=content_type
        )
    entry = rt.catalog.get(model)
    missing = rt.supervisor.capability_error(entry, capability)
    if missing is not None:
        raise missing
    async with rt.supervisor.use(entry.id) as lane:
        own = shape if shape is not None and lane.engine == shape.engine else None
        try:
            async with rt.supervisor.http.post(
                lane.base_url + path,
                data=own.body if own else body,
                headers={"Content-Type": own.content_type if own else content_type},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            ) as upstream:
                data = await upstream.read()
                if own is not None:
                    return own.answer(upstream.status, data)
                headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
                return web.Response(body=data, status=upstream.status, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)  # let the lane see the exit, so the error names it
            raise lane.broken() from exc
