"""Typed keys for state kept on the aiohttp application (never module globals)."""

from __future__ import annotations

from aiohttp import web

from app.runtime import Runtime
from app.server.gateway.core import Gateway

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
