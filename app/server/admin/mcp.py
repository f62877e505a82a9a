"""/api/mcp: the MCP servers registered on this machine, their tools' permissions, and the call log.

Secrets given here (env and header values) go to the keyring and are never part of any answer: a server
shows only the names of its env variables and headers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError
from app.mcp.calls import ToolCallLog
from app.mcp.registry import McpRegistry, check_key
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body

TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


def _registry(request: web.Request) -> McpRegistry:
    return McpRegistry.of(request.app[RUNTIME].paths)


def _strings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequestError(f"'{name}' must map names to string values", param=name)
    return value


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequestError("'timeout_s' must be a number of seconds", param="timeout_s")
    return float(value)


@routes.get("/api/mcp")
async def list_servers(request: web.Request) -> web.Response:
    """The registered MCP servers: transport, command or URL, names of secrets, tool permissions"""
    servers = await asyncio.to_thread(_registry(request).all)
    return web.json_response({"servers": [s.public() for s in servers]})


@routes.post("/api/mcp")
async def add_server(request: web.Request) -> web.Response:
    """Register a server: {"name", "url"} (streamable HTTP) or {"name", "command": [...]} (stdio), with
    "env"?/"headers"? (kept in the keyring)"""
    body = parse_body(await request.read())
    name, url, command = body.get("name"), body.get("url"), body.get("command")
    if not isinstance(name, str):
        raise BadRequestError('send {"name": "...", "url": "http://..."} or {"name": ..., "command": [...]}')
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command)
    ):
        raise BadRequestError("'command' must be a non-empty list of strings (the program, then its args)")
    if url is not None and not isinstance(url, str):
        raise BadRequestError("'url' must be a string", param="url")
    spec = await asyncio.to_thread(
        _registry(request).add,
        name,
        command=tuple(command or ()),
        url=url,
        env=_strings(body.get("env"), "env"),
        headers=_strings(body.get("headers"), "headers"),
        timeout_s=_seconds(body.get("timeout_s")),
    )
    return web.json_response(spec.public(), status=201)


@routes.get("/api/mcp/calls")
async def recent_calls(request: web.Request) -> web.Response:
    """The newest MCP tool calls (?limit=N, default 100): tool, arguments, who asked, time, size, outcome"""
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError as exc:
        raise BadRequestError("'limit' must be an integer", param="limit") from exc
    log = ToolCallLog(request.app[RUNTIME].paths.home / "audit.db")
    rows = await asyncio.to_thread(log.recent, limit=max(1, min(limit, 1000)))
    return web.json_response({"calls": [r.public() for r in rows]})


@routes.get("/api/mcp/{name}/tools")
async def server_tools(request: web.Request) -> web.Response:
    """Connect to a registered server now and list its tools, each with its permission"""
    spec = await asyncio.to_thread(_registry(request).get, request.match_info["name"])
    from app.mcp.client import McpBounds, open_session  # the MCP SDK only when a server is asked

    async with open_session(spec, bounds=McpBounds().for_server(spec)) as session:
        tools = await session.tools()
    return web.json_response(
        {"name": spec.name, "tools": [{**t.listed(), "permission": spec.permission(t.name)} for t in tools]}
    )


@routes.put("/api/mcp/{name}/tools/{tool}")
async def set_permission(request: web.Request) -> web.Response:
    """Set one tool's permission: {"permission": "allow" | "ask" | "deny", "key"?: an API key's name (that
    key's own rule, which wins over the server-wide one)}"""
    body = parse_body(await request.read())
    key = body.get("key")
    if key is not None and not isinstance(key, str):
        raise BadRequestError("'key' must be the name of an API key", param="key")
    if key is not None:
        await asyncio.to_thread(check_key, request.app[RUNTIME].paths, key)
    spec = await asyncio.to_thread(
        _registry(request).set_permission,
        request.match_info["name"],
        tool=request.match_info["tool"],
        permission=str(body.get("permission")),
        key=key,
    )
    return web.json_response(spec.public())


@routes.delete("/api/mcp/{name}")
async def remove_server(request: web.Request) -> web.Response:
    """Remove a server and its secrets"""
    gone = await asyncio.to_thread(_registry(request).remove, request.match_info["name"])
    return web.json_response({"name": gone.name, "removed": True})
