"""Admin API for browsing Hugging Face: search, model detail with per-quantization fit, hub status.

Hub calls block (huggingface_hub is synchronous), so they run in threads. Errors are Switchyard hub errors
rendered as the usual envelope by the errors middleware: 404 hub_repo_not_found, 403 hub_gated,
401 hub_unauthorized, 503 hub_offline, 502 hub_unreachable, 422 remote_header_unreadable.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.hub.api import SearchQuery
from app.hub.browse import Hub
from app.server.gateway.request_input import query_flag, query_int
from app.server.keys import RUNTIME

HUB: web.AppKey[Hub] = web.AppKey("hub", Hub)
TAG = "Hub"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


def setup(app: web.Application) -> None:
    """The Runtime's Hub (it holds a token kept for this process only, and follows applied settings)."""
    rt = app[RUNTIME]
    app[HUB] = rt.hub
    app.add_routes(routes)


def _int(request: web.Request, name: str, default: int) -> int:
    return query_int(request, name, default=default, low=1, high=10_000)


def _flag(request: web.Request, name: str, default: bool) -> bool:
    return query_flag(request, name, default=default)


@routes.get("/api/hub/status")
async def hub_status(request: web.Request) -> web.Response:
    """Endpoint, offline mode, proxy and whether a token is set (and where from), never its value."""
    hub = request.app[HUB]
    doc = await asyncio.to_thread(hub.status, verify=_flag(request, "verify", True))
    return web.json_response(doc)


@routes.get("/api/hub/search")
async def hub_search(request: web.Request) -> web.Response:
    """Search models on the hub: q, format, sort, author, limit, page (next_page says what to pass back)."""
    q = request.query
    query = SearchQuery(
        text=q.get("q") or None,
        format=q.get("format") or None,
        sort=q.get("sort") or "downloads",
        author=q.get("author") or None,
        page=_int(request, "page", 1),
        size=_int(request, "limit", 20),
    )
    hub = request.app[HUB]
    page = await asyncio.to_thread(lambda: hub.client().search(query))
    return web.json_response(page.public())


@routes.get("/api/hub/models/{repo:[^/]+/[^/]+}")
async def hub_model(request: web.Request) -> web.Response:
    """One repository: card, files by quantization and, with fit=true (default), each one's verdict here."""
    rt = request.app[RUNTIME]
    hub = request.app[HUB]
    repo = request.match_info["repo"]
    revision = request.query.get("revision") or None
    fit = _flag(request, "fit", True)
    only = request.query.get("quant") or None
    client = hub.client()
    detail = await asyncio.to_thread(
        client.detail, repo, revision=revision, card=_flag(request, "card", True)
    )
    if fit:
        await rt.fit_hub_model(detail, reader=client.reader, only=only)
    return web.json_response(detail.public())
