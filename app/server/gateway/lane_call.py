"""One request to a lane that is not a token stream (audio, images, rerank): resolved, held and posted
through the gateway like every other request; the answer passed back whole.

A remote model gets the body with its own model name (in a multipart upload, its `model` field: the form is
rebuilt around the same file). An engine whose API differs from OpenAI's gets the request in its own shape
(`EngineShape`: sd-server's images).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError
from app.lanes.target import Target
from app.server.gateway.multipart import form_parts, with_field
from app.server.gateway.relay import keep_header
from app.server.keys import GATEWAY
from app.server.request_keys import MODEL


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


async def renamed_body(target: Target, body: bytes, content_type: str) -> tuple[bytes, str]:
    """(body, content type) as a remote must see them: JSON with its own model name, or a multipart upload
    rebuilt with its `model` field set to that name."""
    if not content_type.startswith("multipart/form-data"):
        return json.dumps({**json.loads(body), "model": target.served_name}).encode(), content_type
    # parsing an upload of many megabytes takes a while (about a second for 25 MB): off the event loop
    parts = await asyncio.to_thread(form_parts, body, content_type)
    return await with_field(parts, name="model", value=target.served_name)


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
    gw = request.app[GATEWAY]
    request[MODEL] = model
    to = await gw.resolve(model, capability)
    request[MODEL] = to.model
    if to.remote is not None:
        body, content_type = await renamed_body(to.remote, body, content_type)
    async with gw.hold(to) as target:
        own = shape if shape is not None and target.engine == shape.engine else None
        # an error status is the target's refusal (raised by post); sd-server's is worded the same way
        upstream = await gw.post(
            target, path, own.body if own else body, content_type=own.content_type if own else content_type
        )
        headers = {k: v for k, v in upstream.headers.items() if keep_header(k)}
        data = await gw.read(target, upstream)
        if own is not None:
            return own.answer(upstream.status, data)
        return web.Response(body=data, status=upstream.status, headers=headers)
