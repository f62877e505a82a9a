"""`POST /v1/images/generations`, routed by `model` to the stable-diffusion.cpp lane (or a remote).

The request is checked here once (prompt, n, size, response_format, and the extras steps, cfg_scale, seed,
negative_prompt, sampler); sd-server gets it in the shape it reads (surfaces/openai/images_engine.py), a
remote model gets the client's body as it came. A model whose lane cannot draw gets `400
capability_missing` naming the lanes and models that can.
"""

from __future__ import annotations

from aiohttp import web

from app.server.gateway.lane_call import EngineShape, call_lane, need_model
from app.server.surfaces.openai.images_engine import from_sdcpp, parse_image_request, to_sdcpp
from app.server.surfaces.openai.validate import parse_body

routes = web.RouteTableDef()


@routes.post("/v1/images/generations")
async def generations(request: web.Request) -> web.Response:
    """Image generation (stable-diffusion.cpp), routed by model; answers b64_json images"""
    raw = await request.read()
    body = parse_body(raw)
    model = need_model(body.get("model"))
    req = parse_image_request(body, model=model)
    shape = EngineShape(
        engine="sd.cpp",
        body=to_sdcpp(req),
        content_type="application/json",
        answer=lambda status, data: from_sdcpp(status, data, model=model),
    )
    return await call_lane(
        request,
        model=model,
        capability="images",
        path="/v1/images/generations",
        body=raw,
        content_type="application/json",
        shape=shape,
    )
