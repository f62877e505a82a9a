"""The OpenAI surface: models, chat, completions, embeddings, audio, images, and rerank beside them."""

from __future__ import annotations

from app.server.surfaces.base import OPENAI, Routes, Surface
from app.server.surfaces.openai import audio, images, rerank, routes, schemas

SURFACE = Surface(
    name="openai",
    tag="OpenAI",
    encoding=OPENAI,
    routes=(
        Routes(routes.routes),
        Routes(audio.routes),
        Routes(images.routes),
        Routes(rerank.routes, tag="Rerank"),  # Jina's and Cohere's shape, not OpenAI's
    ),
    schemas=schemas.SCHEMAS,
    operations=schemas.OPERATIONS,
)
