"""The OpenAPI schemas of the Ollama surface: chat, generate, embed, show and the model lists."""

from __future__ import annotations

from typing import Any

from app.server.surfaces.schemas import (
    BOOL,
    INT,
    NDJSON,
    NUM,
    OBJ,
    STR,
    STRING_OR_STRINGS,
    STRINGS,
    Operation,
    ok,
    ref,
)

_KEEP_ALIVE = {
    "oneOf": [STR, NUM],
    "description": "How long the model stays loaded after this request: '5m', '1h', seconds, 0 unloads, "
    "a negative value keeps it loaded. Sets the lane's idle TTL.",
}
_OLLAMA_COMMON = {
    "model": {
        "type": "string",
        "description": "An Ollama name from GET /api/tags ('tiny' or 'tiny:latest').",
    },
    "stream": {"type": "boolean", "description": "NDJSON pieces unless false (the default is true)."},
    "format": {"oneOf": [{"const": "json"}, OBJ, {"const": ""}]},
    "options": {
        "type": "object",
        "description": "Sampling options (temperature, top_p, top_k, seed, num_predict, stop, ...); "
        "load-time ones (num_ctx, num_gpu, ...) are ignored and named in X-Switchyard-Ignored-Options.",
    },
    "keep_alive": _KEEP_ALIVE,
    "think": {"oneOf": [BOOL, STR]},
}
_OLLAMA_DONE = {
    "model": STR,
    "created_at": STR,
    "done": BOOL,
    "done_reason": STR,
    "total_duration": INT,
    "load_duration": INT,
    "prompt_eval_count": INT,
    "prompt_eval_duration": INT,
    "eval_count": INT,
    "eval_duration": INT,
}

SCHEMAS: dict[str, Any] = {
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "OllamaChatRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **_OLLAMA_COMMON,
            "messages": {
                "type": "array",
                "description": "Empty or absent: load the model (keep_alive 0: unload it) and answer done.",
                "items": {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
                        "content": STR,
                        "images": STRINGS,
                        "tool_calls": {"type": "array", "items": OBJ},
                        "thinking": STR,
                    },
                },
            },
            "tools": {"type": "array", "items": OBJ},
        },
    },
    "OllamaGenerateRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **_OLLAMA_COMMON,
            "prompt": {"type": "string", "description": "Empty or absent: load (or unload) the model."},
            "suffix": STR,
            "system": STR,
            "template": STR,
            "raw": {"type": "boolean", "description": "The prompt as is, without the chat template."},
            "images": STRINGS,
        },
    },
    "OllamaEmbedRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": STR,
            "input": STRING_OR_STRINGS,
            "truncate": BOOL,
            "dimensions": {"type": "integer", "minimum": 1},
            "options": OBJ,
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "OllamaEmbeddingsRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": STR, "prompt": STR, "options": OBJ, "keep_alive": _KEEP_ALIVE},
    },
    "OllamaShowRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": STR, "verbose": BOOL},
    },
    "OllamaChatResponse": {
        "type": "object",
        "required": ["model", "created_at", "done"],
        "properties": {
            **_OLLAMA_DONE,
            "message": {
                "type": "object",
                "properties": {"role": STR, "content": STR, "thinking": STR, "tool_calls": OBJ},
            },
        },
    },
    "OllamaGenerateResponse": {
        "type": "object",
        "required": ["model", "created_at", "done"],
        "properties": {**_OLLAMA_DONE, "response": STR, "thinking": STR},
    },
    "OllamaEmbedResponse": {
        "type": "object",
        "required": ["model", "embeddings"],
        "properties": {
            "model": STR,
            "embeddings": {"type": "array", "items": {"type": "array", "items": NUM}},
            "total_duration": INT,
            "load_duration": INT,
            "prompt_eval_count": INT,
        },
    },
    "OllamaEmbeddingResponse": {
        "type": "object",
        "required": ["embedding"],
        "properties": {"embedding": {"type": "array", "items": NUM}},
    },
    "OllamaModel": {
        "type": "object",
        "required": ["name", "model", "size", "digest", "details"],
        "properties": {
            "name": STR,
            "model": STR,
            "modified_at": STR,
            "size": INT,
            "digest": STR,
            "details": OBJ,
            "expires_at": STR,
            "size_vram": INT,
            "context_length": INT,
        },
    },
    "OllamaModelList": {
        "type": "object",
        "required": ["models"],
        "properties": {"models": {"type": "array", "items": ref("OllamaModel")}},
    },
    "OllamaShowResponse": {
        "type": "object",
        "required": ["details", "model_info", "capabilities"],
        "properties": {
            "modelfile": STR,
            "parameters": STR,
            "template": STR,
            "details": OBJ,
            "model_info": OBJ,
            "capabilities": STRINGS,
            "modified_at": STR,
        },
    },
}
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/api/tags"): (None, ok(ref("OllamaModelList"))),
    ("GET", "/api/ps"): (None, ok(ref("OllamaModelList"))),
    ("POST", "/api/show"): ("OllamaShowRequest", ok(ref("OllamaShowResponse"))),
    ("POST", "/api/chat"): (
        "OllamaChatRequest",
        ok(ref("OllamaChatResponse"), NDJSON, "NDJSON pieces, or with `stream: false` one answer"),
    ),
    ("POST", "/api/generate"): (
        "OllamaGenerateRequest",
        ok(ref("OllamaGenerateResponse"), NDJSON, "NDJSON pieces, or with `stream: false` one answer"),
    ),
    ("POST", "/api/embed"): ("OllamaEmbedRequest", ok(ref("OllamaEmbedResponse"))),
    ("POST", "/api/embeddings"): ("OllamaEmbeddingsRequest", ok(ref("OllamaEmbeddingResponse"))),
}
