"""The Anthropic surface: Messages and the token count, in Anthropic's error shape and named SSE events."""

from __future__ import annotations

from app.server.surfaces.anthropic import routes, schemas
from app.server.surfaces.base import ANTHROPIC, Routes, Surface

SURFACE = Surface(
    name="anthropic",
    tag="Anthropic",
    encoding=ANTHROPIC,
    routes=(Routes(routes.routes),),
    schemas=schemas.SCHEMAS,
    operations=schemas.OPERATIONS,
    # the SDKs send these from a browser too: a listed origin's preflight allows them
    cors_headers=("anthropic-version", "anthropic-beta"),
)
