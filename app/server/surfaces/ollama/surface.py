"""The Ollama surface: its client API (NDJSON streams, `{"error": ...}` bodies) and its model management."""

from __future__ import annotations

from app.server.surfaces.base import OLLAMA, Routes, Surface
from app.server.surfaces.ollama import manage_routes, routes, schemas

SURFACE = Surface(
    name="ollama",
    tag="Ollama",
    encoding=OLLAMA,
    routes=(
        Routes(routes.routes),
        # pull, delete, copy, create change this machine: the admin gate applies (app/server/auth.py)
        Routes(manage_routes.routes, manages=True),
    ),
    schemas=schemas.SCHEMAS,
    operations=schemas.OPERATIONS,
)
