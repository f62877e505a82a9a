"""The pieces the OpenAPI schemas of every surface are written with (app/server/openapi.py assembles them).

Each surface package keeps its own schemas beside its routes (`schemas.py`: SCHEMAS for the document's
components, OPERATIONS for its routes) and names them in its `Surface` (its surface.py).
A request schema lists the fields the surface reads, with the types it accepts; fields outside it are
ignored or refused with a 400 that names them. Answers list their required fields only where the server
always sends them.
"""

from __future__ import annotations

from typing import Any

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
Operation = tuple[str | None, dict[str, Any]]  # (request schema name or None, the 200 answer)


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def ok(schema: dict[str, Any], stream: str | None = None, description: str = "OK") -> dict[str, Any]:
    """A 200 answer of `schema` as JSON, and as the `stream` media type when the route can stream."""
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if stream:
        content[stream] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}
OBJ = {"type": "object"}
STRINGS = {"type": "array", "items": STR}
STRING_OR_STRINGS = {"oneOf": [STR, STRINGS]}
