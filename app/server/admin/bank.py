"""/api/bank: the session bank's checkpoints (admin API), listed and cleared.

`GET /api/bank` gives the bank's size, its budget and one row per checkpoint; `DELETE /api/bank` empties
it, `DELETE /api/bank?model=ID` only that model's part. `switchyard bank ls / clear` and the `ps` column
read these routes (app/lanes/bank/sessions.py has the same as functions, for a command without a server).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.errors import BadRequestError
from app.lanes.bank.sessions import MIB, bank_clear, bank_summary
from app.server.keys import GATEWAY, RUNTIME

TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/api/bank")
async def list_bank(request: web.Request) -> web.Response:
    """The session bank: bytes used, the budget, and each checkpoint (model, tokens, messages, bytes, when
    last used); `counters` are this server's saves, restores, hits and misses since it started"""
    rt = request.app[RUNTIME]
    budget = rt.settings.models.session_bank_budget_mib * MIB
    summary = await asyncio.to_thread(bank_summary, rt.paths.home, budget_bytes=budget)
    counters = request.app[GATEWAY].bank.counters
    summary["enabled"] = rt.settings.models.session_bank
    summary["counters"] = {
        "saves": counters.saves,
        "restores": counters.restores,
        "hits": counters.hits,
        "misses": counters.misses,
    }
    return web.json_response(summary)


@routes.delete("/api/bank")
async def clear_bank(request: web.Request) -> web.Response:
    """Drop every checkpoint, or with `?model=ID` only that model's: {"dropped", "bytes"}"""
    model = request.query.get("model")
    if model is not None and not model.strip():
        raise BadRequestError(
            "'model' must name a model id (see GET /api/bank), or leave it out", param="model"
        )
    rt = request.app[RUNTIME]
    return web.json_response(await asyncio.to_thread(bank_clear, rt.paths.home, model_id=model))
