"""The OpenAPI schemas of the OpenAI surface: models, chat, completions, embeddings, images, and rerank
(Jina's and Cohere's shape, served beside them)."""

from __future__ import annotations

from typing import Any

from app.server.surfaces.schemas import INT, NUM, SSE, STR, Operation, ok, ref

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


def _function_item(
    required: list[str], properties: dict[str, Any], *, with_id: bool = False
) -> dict[str, Any]:
    """`{"type": "function", "function": {...}}`, the call's `id` first when `with_id`: a tool, a call of one,
    or a forced choice of one; `required` and `properties` are the function object's."""
    ident = {"id": {"type": "string"}} if with_id else {}
    function = {"type": "object", "required": required, "properties": properties}
    return {
        "type": "object",
        "required": [*ident, "type", "function"],
        "properties": {**ident, "type": {"const": "function"}, "function": function},
    }


def _completion(obj: str, **answer: dict[str, Any]) -> dict[str, Any]:
    """A chat or text completion: `obj` names it, and each choice holds its index, `answer` (the message, or
    the text) and why it finished."""
    choice = {"index": {"type": "integer"}, **answer, "finish_reason": {"type": ["string", "null"]}}
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": obj},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": {"type": "object", "properties": choice}},
            "usage": _USAGE,
        },
    }


SCHEMAS: dict[str, Any] = {
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
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
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
                    "tool_calls": {"type": "array", "items": ref("ToolCall")},
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
    "ToolCall": _function_item(
        ["name", "arguments"],
        {"name": {"type": "string"}, "arguments": {"type": "string", "description": "JSON text."}},
        with_id=True,
    ),
    "Tool": _function_item(
        ["name"],
        {"name": {"type": "string"}, "description": {"type": "string"}, "parameters": {"type": "object"}},
    ),
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
            "max_completion_tokens": {"type": "integer"},
            "tools": {"type": "array", "items": ref("Tool")},
            "tool_choice": {
                "oneOf": [
                    {"enum": ["none", "auto", "required"]},
                    _function_item(["name"], {"name": {"type": "string"}}),
                ]
            },
            "response_format": {"type": "object"},
        },
        "description": "Other fields reach the engine unchanged (llama.cpp's extensions work).",
    },
    "ChatCompletion": _completion(
        "chat.completion",
        message={
            "type": "object",
            "properties": {
                "role": {"type": "string"},
                "content": {"type": ["string", "null"]},
                "tool_calls": {"type": "array"},
            },
        },
    ),
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
    "Completion": _completion("text_completion", text={"type": "string"}),
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

# ---- Rerank (Jina / Cohere shape) ----------------------------------------------------------------
_RERANK_DOC = {
    "oneOf": [STR, {"type": "object", "required": ["text"], "properties": {"text": STR}}],
}
SCHEMAS["RerankRequest"] = {
    "type": "object",
    "required": ["model", "query", "documents"],
    "properties": {
        "model": {"type": "string", "description": "A reranker model id (kind `rerank` in GET /v1/models)."},
        "query": {"type": "string", "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "items": _RERANK_DOC},
        "top_n": {"type": "integer", "minimum": 1, "description": "Return only the best N results."},
        "return_documents": {"type": "boolean", "description": "Add each result's document text."},
    },
}
SCHEMAS["RerankResponse"] = {
    "type": "object",
    "required": ["model", "results", "usage"],
    "properties": {
        "model": STR,
        "object": {"const": "list"},
        "results": {
            "type": "array",
            "description": "Sorted by relevance_score, best first.",
            "items": {
                "type": "object",
                "required": ["index", "relevance_score"],
                "properties": {
                    "index": {**INT, "description": "The document's position in the request."},
                    "relevance_score": NUM,
                    "document": {"type": "object", "properties": {"text": STR}},
                },
            },
        },
        "usage": {"type": "object", "properties": {"prompt_tokens": INT, "total_tokens": INT}},
    },
}
_RERANK_OP = ("RerankRequest", ok(ref("RerankResponse")))

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/v1/models"): (None, ok(ref("ModelList"))),
    ("GET", "/v1/models/{model_id}"): (None, ok(ref("Model"))),
    ("POST", "/v1/chat/completions"): (
        "ChatCompletionRequest",
        ok(ref("ChatCompletion"), SSE, "A chat completion, or with `stream: true` the engine's event stream"),
    ),
    ("POST", "/v1/completions"): (
        "CompletionRequest",
        ok(ref("Completion"), SSE, "A completion, or with `stream: true` the engine's event stream"),
    ),
    ("POST", "/v1/embeddings"): ("EmbeddingRequest", ok(ref("EmbeddingList"))),
    ("POST", "/v1/images/generations"): ("ImageRequest", ok(ref("ImagesResponse"))),
    ("POST", "/v1/rerank"): _RERANK_OP,
    ("POST", "/rerank"): _RERANK_OP,
    ("POST", "/v2/rerank"): _RERANK_OP,
}
