"""One request to a lane that is not a token stream (audio, images): resolve the model, check that its
lane can do what the route asks, start the lane just in time, pass the body through, pass the answer back."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError
from app.lanes.lane import crashed_error
from app.server.keys import RUNTIME

_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}


def need_model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequestError("field 'model' must name a model from GET /v1/models", param="model")
    return value


async def call_lane(
    request: web.Request, *, model: str, capability: str, path: str, body: bytes, content_type: str
) -> web.Response:
    rt = request.app[RUNTIME]
    request["model"] = model
    entry = rt.catalog.get(model)
    missing = rt.supervisor.capability_error(entry, capability)
    if missing is not None:
        raise missing
    async with rt.supervisor.use(entry.id) as lane:
        try:
            async with rt.supervisor.http.post(
                lane.base_url + path,
                data=body,
                headers={"Content-Type": content_type},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            ) as upstream:
                data = await upstream.read()
                headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
                return web.Response(body=data, status=upstream.status, headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)  # let the lane see the exit, so the error names it
            raise crashed_error(lane) from exc
