"""`POST /v1/images/generations`, routed by `model`. No image lane runs here yet (stable-diffusion.cpp is
planned); the route answers what the model's lane cannot do, so clients get a clear 400 or 422 today and
the same route works once the lane lands."""

from __future__ import annotations

from aiohttp import web

from app.core.errors import BadRequestError
from app.server.lane_call import call_lane, need_model
from app.server.validate import parse_body

routes = web.RouteTableDef()


@routes.post("/v1/images/generations")
async def generations(request: web.Request) -> web.Response:
    """Image generation, routed by model (no image lane runs yet: the answer says why)"""
    raw = await request.read()
    body = parse_body(raw)
    model = need_model(body.get("model"))
    if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
        raise BadRequestError("missing required field 'prompt' (what to draw)", param="prompt")
    return await call_lane(
        request,
        model=model,
        capability="images",
        path="/v1/images/generations",
        body=raw,
        content_type="application/json",
    )
