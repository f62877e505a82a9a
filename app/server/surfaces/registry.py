"""SURFACES: every API surface the server answers on, in the order its routes are added.

The one place a surface is added (the contract: app/server/surfaces/__init__.py). app/server/app.py
installs each; authentication, the OpenAPI document and the safety policy's groups read this tuple, and
tests/server/surfaces/test_registry.py checks it against the packages on disk.
"""

from __future__ import annotations

from app.server.surfaces.anthropic.surface import SURFACE as ANTHROPIC
from app.server.surfaces.base import Surface
from app.server.surfaces.ollama.surface import SURFACE as OLLAMA
from app.server.surfaces.openai.surface import SURFACE as OPENAI
from app.server.surfaces.responses.surface import SURFACE as RESPONSES

SURFACES: tuple[Surface, ...] = (OPENAI, RESPONSES, ANTHROPIC, OLLAMA)
