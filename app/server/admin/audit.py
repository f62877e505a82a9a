"""`GET /api/audit`: the safety judges' verdicts from audit.db, newest first (docs/safety.md).

An admin route like the rest of /api: it answers only on this machine unless allow_remote_admin is set.
Query: `limit` (1-1000, default 100), `verdict` (safe, controversial, unsafe, error), `since` (Unix time).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.errors import BadRequestError, SwitchyardError
from app.core.policy import parse_policy
from app.safety.formats import LEVELS
from app.server.gateway.safety_gate import audit_log
from app.server.keys import GATEWAY, RUNTIME

TAG = "Safety"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/api/audit")
async def audit(request: web.Request) -> web.Response:
    q = request.query
    limit = _number(q.get("limit", "100"), "limit", int)
    if not 1 <= limit <= 1000:
        raise BadRequestError("limit must be between 1 and 1000", param="limit")
    verdict = q.get("verdict")
    if verdict is not None and verdict not in (*LEVELS, "error"):
        raise BadRequestError(
            f"verdict must be one of {', '.join((*LEVELS, 'error'))}, got {verdict!r}", param="verdict"
        )
    since = _number(q["since"], "since", float) if "since" in q else None
    rows = await asyncio.to_thread(audit_log(request.app).recent, limit=limit, verdict=verdict, since=since)
    policy = parse_policy(request.app[RUNTIME].settings.safety.policy)
    judges = []
    for spec in policy.judges:  # a judge the server cannot run is shown as such, never as judging
        try:
            await request.app[GATEWAY].resolve(spec.model, "completions")
            judges.append({"model": spec.model, "can_judge": True, "reason": None})
        except SwitchyardError as exc:
            judges.append({"model": spec.model, "can_judge": False, "reason": exc.message})
    return web.json_response(
        {
            "enabled": policy.enabled,
            "judging": policy.enabled and any(j["can_judge"] for j in judges),
            "judges": judges,
            "records": [r.public() for r in rows],
        }
    )


def _number(text: str, name: str, kind: type[int] | type[float]) -> int:
    try:
        return kind(text)  # type: ignore[return-value]
    except ValueError:
        raise BadRequestError(f"{name} must be a number, got {text!r}", param=name) from None
