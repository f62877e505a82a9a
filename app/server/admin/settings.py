"""Admin API for settings a running server takes: GET/PUT /api/settings, and the body of a load.

`PUT /api/settings` writes only the keys it is sent into settings.json (under the file's lock) and applies
them at once through `Runtime.apply_settings`; its answer names the lanes restarted and the keys that wait
for the server's next start. `POST /api/models/{id}/load` with a body is answered here too (see `load`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError, ModelTooLargeError, SettingsError, SwitchyardError
from app.core.notify import public_config
from app.core.policy import parse_policy
from app.core.settings import LOAD_KEYS, Settings, check_overrides
from app.core.settings_file import set_settings
from app.core.settings_live import effective
from app.hub.config import masked_url
from app.lanes.lane import Lane
from app.runtime import Runtime
from app.server.gateway.request_input import parse_json_object
from app.server.keys import GATEWAY, RUNTIME

TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


def public_settings(settings: Settings) -> dict[str, Any]:
    """The settings as JSON, a proxy's password masked."""
    out = settings.public()
    out["hf_proxy"] = masked_url(settings.hub.hf_proxy)
    out["notify"] = public_config(settings.jobs.notify)  # hook URLs (a chat service's token) and secrets
    return out


def lane_view(lane: Lane, settings: Settings) -> dict[str, Any]:
    """A lane's snapshot with its effective values under the load body's names (`settings`)."""
    snap = lane.snapshot()
    params = snap.get("params") if isinstance(snap.get("params"), dict) else None
    snap["settings"] = effective(params, settings, model_id=lane.model_id)
    return snap


@routes.get("/api/settings")
async def get_settings(request: web.Request) -> web.Response:
    """The settings the server runs with now (applied ones included) and the hub it talks to."""
    rt = request.app[RUNTIME]
    return web.json_response(
        {
            "settings": public_settings(rt.settings),
            "hub": rt.hub.config().public(),
            "file": str(rt.paths.settings_file),
        }
    )


@routes.put("/api/settings")
async def put_settings(request: web.Request) -> web.Response:
    """Write these keys into settings.json and apply them now; 400 names a key or value it refuses."""
    rt = request.app[RUNTIME]
    body = parse_json_object(await request.read())
    await _check_judges(request, body)
    try:
        # the file first (it refuses what the server would refuse, writing nothing), then the running server
        await asyncio.to_thread(set_settings, rt.paths.settings_file, body, origin="the settings sent")
        change = await rt.change_settings(body)
    except SettingsError as exc:
        raise BadRequestError(exc.message, param=next(iter(body), None)) from exc
    return web.json_response({**change.public(), "settings": public_settings(rt.settings)})


async def _check_judges(request: web.Request, body: dict[str, Any]) -> None:
    """400 for an enabled policy naming a judge this server cannot run (a typo would otherwise turn
    judging off without a word under fail: open)."""
    if not isinstance(body.get("policy"), dict):
        return
    try:
        policy = parse_policy(body["policy"])
    except SettingsError as exc:
        raise BadRequestError(exc.message, param="policy") from exc
    if not policy.enabled:
        return
    for i, spec in enumerate(policy.judges):
        try:
            await request.app[GATEWAY].resolve(spec.model, "completions")
        except SwitchyardError as exc:
            raise BadRequestError(
                f"policy.judges[{i}].model {spec.model!r} cannot judge on this server ({exc.message}); "
                "name a model `switchyard ls` lists, or pull a guard model with "
                "`switchyard guard enable NAME`",
                param="policy",
            ) from exc


async def load_with_body(rt: Runtime, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """Check the body, show the plan before and after, refuse one that does not fit (nothing changed),
    else take the values (the loaded lane restarts with them) and load."""
    try:
        check_overrides(model, body, allowed=LOAD_KEYS, where="the load body")
    except SettingsError as exc:
        raise BadRequestError(exc.message, param=next(iter(body), None)) from exc
    before = await rt.explain(model)
    after = await rt.explain(model, overrides=body)
    # a split or a multi-node model is planned over its machines when it starts, not on this one alone
    if (
        rt.settings.memory.enforce_fit
        and after.fit is not None
        and not after.fit.fits
        and not body.get("split")
        and not body.get("nodes")
    ):
        raise ModelTooLargeError(
            f"model {model!r} does not fit with {body}: {after.fit.summary}; nothing was changed — "
            "ask for a smaller ctx_size, a smaller kv_type or fewer gpu_layers"
        )
    previous = rt.settings.models.model_overrides.get(model)
    change = await rt.set_overrides(model, body)
    try:
        lane = await rt.supervisor.load(model)
    except SwitchyardError as exc:
        # the engine refused these values: the model's settings go back to what they were
        await rt.restore_overrides(model, previous)
        exc.message = f"{exc.message}; the load body was not kept (the previous settings are back)"
        raise
    return {
        **lane_view(lane, rt.settings),
        "plan": {"before": _plan(before.fit), "after": _plan(after.fit)},
        "change": change.public(),
    }


def _plan(fit: Any) -> dict[str, Any] | None:
    return fit.public() if fit is not None else None
