"""The OpenAI Responses surface: POST /v1/responses, in OpenAI's error envelope and named SSE events."""

from __future__ import annotations

from app.server.surfaces.base import OPENAI, Routes, Surface
from app.server.surfaces.responses import routes, schemas

SURFACE = Surface(
    name="responses",
    tag="OpenAI",
    encoding=OPENAI,
    routes=(Routes(routes.routes),),
    schemas=schemas.SCHEMAS,
    operations=schemas.OPERATIONS,
)
