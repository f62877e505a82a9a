"""`GET /openapi.json`: an OpenAPI 3.1 document generated from the application's route table.

Every route the app serves is listed (HEAD, which each GET also answers, is left out). A summary is the
first line of the handler's docstring, else a line from SUMMARIES; the rest of the docstring is the
description. The OpenAI, Anthropic, Ollama and Responses routes and the error envelopes have hand-written
schemas (the translated surfaces' in openapi_surfaces.py); admin bodies are described as JSON objects
(docs/api.md has them in full).

The committed copy, docs/openapi.json, is regenerated with

    .venv/bin/python -m app.server.openapi_write          # writes docs/openapi.json
    .venv/bin/python -m app.server.openapi_write --check  # exits 1 if the committed copy is stale
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from app import __version__
from app.server import openapi_surfaces
from app.server.surface import Surface

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
_METHODS = ("get", "post", "put", "patch", "delete")
_TAGS = {
    "routes_openai": "OpenAI",
    "routes_responses": "OpenAI",
    "routes_audio": "OpenAI",
    "routes_images": "OpenAI",
    "routes_rerank": "Rerank",
    "routes_anthropic": "Anthropic",
    "routes_ollama": "Ollama",
    "routes_ollama_manage": "Ollama",
    "routes_admin": "Admin",
    "routes_remotes": "Admin",
    "routes_library": "Library",
    "routes_hub": "Hub",
    "routes_downloads": "Downloads",
    "routes_engines": "Engines",
    "routes_evals": "Evals",
    "auth": "Admin",
    "metrics": "Observability",
    "openapi": "Observability",
}
# for handlers without a docstring (wrapped ones, mostly)
SUMMARIES = {
    ("GET", "/v1/models"): "List the servable models",
    ("GET", "/v1/models/{model_id}"): "One model",
    ("POST", "/v1/chat/completions"): "Chat completion, passed through to the model's engine",
    ("POST", "/v1/completions"): "Text completion, passed through to the model's engine",
    ("POST", "/v1/embeddings"): "Embeddings, passed through to the model's engine",
    ("POST", "/v1/responses"): "OpenAI Responses API, translated onto chat",
    ("POST", "/v1/messages"): "Anthropic Messages, translated onto chat",
    ("POST", "/v1/messages/count_tokens"): "Anthropic token count",
    ("GET", "/api/tags"): "Ollama: the models",
    ("GET", "/api/ps"): "Ollama: the loaded models",
    ("POST", "/api/show"): "Ollama: one model's details",
    ("POST", "/api/chat"): "Ollama: chat",
    ("POST", "/api/generate"): "Ollama: generate from a prompt",
    ("POST", "/api/embed"): "Ollama: embeddings",
    ("POST", "/api/embeddings"): "Ollama: one embedding (the older endpoint)",
    ("GET", "/health"): "Liveness and lane counts",
    ("GET", "/api/version"): "Version",
    ("GET", "/api/downloads/{job_id}"): "One download",
    ("GET", "/api/models"): "Every model file found, broken ones included",
    ("POST", "/api/models/{model_id}/load"): "Start a model's lane and wait until it is ready",
    ("POST", "/api/models/{model_id}/unload"): "Stop a model's lane",
    ("GET", "/api/lanes"): "All lanes",
    ("GET", "/api/lanes/{lane_id}"): "One lane",
    ("GET", "/api/lanes/{lane_id}/logs"): "The last lines of a lane's engine output",
    ("GET", "/api/hardware"): "The hardware snapshot",
    ("GET", "/api/keys"): "List the API keys (names only)",
    ("POST", "/api/keys"): "Create an API key",
    ("DELETE", "/api/keys/{name}"): "Revoke an API key",
}
_NO_BODY = {
    ("POST", "/api/models/{model_id}/load"),
    ("POST", "/api/models/{model_id}/unload"),
    ("POST", "/api/remotes/{name}/check"),
    ("POST", "/api/engines/update"),
    ("POST", "/api/engines/{engine}/update"),
    ("POST", "/api/engines/{engine}/rollback"),
}
_QUERY = {
    ("GET", "/api/lanes/{lane_id}/logs"): [
        {
            "name": "lines",
            "in": "query",
            "required": False,
            "description": "How many lines (default 200).",
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    ]
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_STRING_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_SAMPLING: dict[str, Any] = {
    "model": {"type": "string", "description": "A model id from GET /v1/models."},
    "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer"},
    "n": {"type": "integer"},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "seed": {"type": "integer"},
    "stop": _STRING_OR_LIST,
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "grammar": {"type": "string", "description": "llama.cpp extension: a GBNF grammar the output follows."},
}
_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
}
SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "The envelope of every Switchyard error outside the Anthropic and Ollama routes.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string", "description": "What went wrong and what to do next."},
                    "type": {"type": "string", "description": "An OpenAI error type."},
                    "param": {"type": ["string", "null"], "description": "The offending request field."},
                    "code": {"type": ["string", "null"], "description": "Stable, for programs."},
                    "source": {"type": "string", "enum": ["gateway", "engine", "remote"]},
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "kind": {"type": "string", "enum": ["chat", "embedding", "rerank"]},
            "loaded": {"type": "boolean"},
            "state": {"type": "string", "enum": ["stopped", "starting", "ready", "stopping", "failed"]},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}},
    },
    "ChatMessage": {
        "description": "A system/user/developer turn with content, an assistant turn (content and/or "
        "tool_calls), or a tool result.",
        "oneOf": [
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["system", "user", "developer"]},
                    "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1}]},
                    "name": {"type": "string"},
                },
            },
            {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": _ref("ToolCall")},
                },
            },
            {
                "type": "object",
                "required": ["role", "content", "tool_call_id"],
                "properties": {
                    "role": {"const": "tool"},
                    "content": {"type": "string"},
                    "tool_call_id": {"type": "string"},
                },
            },
        ],
    },
    "ToolCall": {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {
                    "name": {"type": "string"},
                    "arguments": {"type": "string", "description": "JSON text."},
                },
            },
        },
    },
    "Tool": {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                },
            },
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
            "max_completion_tokens": {"type": "integer"},
            "tools": {"type": "array", "items": _ref("Tool")},
            "tool_choice": {
                "oneOf": [
                    {"enum": ["none", "auto", "required"]},
                    {
                        "type": "object",
                        "required": ["type", "function"],
                        "properties": {
                            "type": {"const": "function"},
                            "function": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                        },
                    },
                ]
            },
            "response_format": {"type": "object"},
        },
        "description": "Other fields reach the engine unchanged (llama.cpp's extensions work).",
    },
    "ChatCompletion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "message": {
                            "type": "object",
                            "properties": {
                                "role": {"type": "string"},
                                "content": {"type": ["string", "null"]},
                                "tool_calls": {"type": "array"},
                            },
                        },
                        "finish_reason": {"type": ["string", "null"]},
                    },
                },
            },
            "usage": _USAGE,
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
        },
    },
    "Completion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "text_completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "finish_reason": {"type": ["string", "null"]},
                    },
                },
            },
            "usage": _USAGE,
        },
    },
    "EmbeddingRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "description": "An embedding model id from GET /v1/models."},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1}]},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        },
    },
    "EmbeddingList": {
        "type": "object",
        "required": ["object", "data", "model"],
        "properties": {
            "object": {"const": "list"},
            "model": {"type": "string"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]
                        },
                    },
                },
            },
            "usage": _USAGE,
        },
    },
    "ImageRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string", "description": "An image model id from GET /v1/models."},
            "prompt": {"type": "string"},
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "size": {"type": "string", "description": "WIDTHxHEIGHT (64 to 4096 each), or auto."},
            "response_format": {"type": "string", "enum": ["b64_json"]},
            "output_format": {"type": "string", "enum": ["png", "jpeg", "webp"]},
            "output_compression": {"type": "integer", "minimum": 0, "maximum": 100},
            "steps": {"type": "integer", "description": "Extension: sampling steps (1 to 150)."},
            "cfg_scale": {"type": "number", "description": "Extension: classifier-free guidance scale."},
            "seed": {"type": "integer", "description": "Extension: -1 for a random seed."},
            "negative_prompt": {"type": "string", "description": "Extension: what not to draw."},
            "sampler": {"type": "string", "description": "Extension: sd.cpp's sample method (euler_a, ...)."},
        },
    },
    "ImagesResponse": {
        "type": "object",
        "required": ["created", "data"],
        "properties": {
            "created": {"type": "integer"},
            "data": {
                "type": "array",
                "items": {"type": "object", "properties": {"b64_json": {"type": "string"}}},
            },
            "output_format": {"type": "string"},
        },
    },
}
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}
_OPENAI: dict[tuple[str, str], tuple[str | None, dict[str, Any]]] = {
    ("GET", "/v1/models"): (None, _json(_ref("ModelList"))),
    ("GET", "/v1/models/{model_id}"): (None, _json(_ref("Model"))),
    ("POST", "/v1/chat/completions"): (
        "ChatCompletionRequest",
        {
            "description": "A chat completion, or with `stream: true` the engine's event stream",
            "content": {"application/json": {"schema": _ref("ChatCompletion")}, **_SSE},
        },
    ),
    ("POST", "/v1/completions"): (
        "CompletionRequest",
        {
            "description": "A completion, or with `stream: true` the engine's event stream",
            "content": {"application/json": {"schema": _ref("Completion")}, **_SSE},
        },
    ),
    ("POST", "/v1/embeddings"): ("EmbeddingRequest", _json(_ref("EmbeddingList"))),
    ("POST", "/v1/images/generations"): ("ImageRequest", _json(_ref("ImagesResponse"))),
}
_TEXT_ANSWERS = {
    ("GET", "/metrics"): {"text/plain": {"schema": {"type": "string"}}},
    ("GET", "/api/events"): _SSE,
    ("GET", "/api/engines/events"): _SSE,
}


def _summary(method: str, path: str, handler: Any) -> tuple[str, str | None]:
    doc = inspect.getdoc(handler)
    if doc:
        first, _, rest = doc.partition("\n")
        return first.strip().rstrip("."), " ".join(rest.split()) or None
    return SUMMARIES.get((method, path), f"{method} {path}"), None


def _error_schema(handler: Any) -> dict[str, str]:
    """The error body of the surface the handler serves (app/server/surface.py)."""
    surface = getattr(handler, "surface", None)
    name = surface.name if isinstance(surface, Surface) else "openai"
    return _ref({"anthropic": "AnthropicError", "ollama": "OllamaError"}.get(name, "Error"))


def _operation(method: str, path: str, handler: Any) -> dict[str, Any]:
    module = str(getattr(handler, "__module__", "")).rsplit(".", 1)[-1]
    tag = _TAGS.get(module, module or "Other")
    summary, description = _summary(method, path, handler)
    op: dict[str, Any] = {
        "operationId": re.sub(r"[^A-Za-z0-9]+", "_", f"{method.lower()}{path}").strip("_"),
        "summary": summary,
        "tags": [tag],
    }
    if description:
        op["description"] = description
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{([^}]+)}", path)
    ]
    params += _QUERY.get((method, path), [])
    if params:
        op["parameters"] = params
    known = _OPENAI.get((method, path)) or openapi_surfaces.OPERATIONS.get((method, path))
    request_schema, ok = known if known is not None else (None, None)
    if request_schema is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request_schema)}},
        }
    elif method == "POST" and (method, path) not in _NO_BODY:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    if ok is None:
        text = _TEXT_ANSWERS.get((method, path))
        ok = {"description": "OK", "content": text} if text else _json({"type": "object"})
    op["responses"] = {"200": ok, "default": _json(_error_schema(handler), "An error")}
    return op


def document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document of every route in `app`'s router."""
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        method = route.method.upper()
        if method.lower() not in _METHODS or route.resource is None:
            continue  # HEAD mirrors GET; '*' routes have no single operation
        path = route.resource.canonical
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, route.handler)
    ordered = {
        p: {m: ops[m] for m in _METHODS if m in ops} for p, ops in sorted(paths.items(), key=lambda kv: kv[0])
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard",
            "version": __version__,
            "description": (
                "Local models behind OpenAI-, Anthropic- and Ollama-compatible APIs. Every GET route also "
                "answers HEAD. Path parameters named model_id or lane_id may contain '/'. See docs/api.md."
            ),
        },
        "servers": [{"url": "http://127.0.0.1:8686"}],
        "security": [{}, {"bearer": []}, {"apiKey": []}],
        "paths": ordered,
        "components": {
            "schemas": {**SCHEMAS, **openapi_surfaces.SCHEMAS},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key as a bearer token.",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


routes = web.RouteTableDef()


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    """This document: OpenAPI 3.1, generated from the server's route table"""
    return web.Response(text=render(document(request.app)), content_type="application/json")
