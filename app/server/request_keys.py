"""Typed keys for what one request learns on its way (the model it named, the client its key names),
read by the request log, /metrics and the per-client limits."""

from __future__ import annotations

from aiohttp import web

MODEL: web.RequestKey[str] = web.RequestKey("model", str)
CLIENT: web.RequestKey[str] = web.RequestKey("client", str)
