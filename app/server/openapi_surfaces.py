"""Hand-written OpenAPI schemas of the translated surfaces: Anthropic Messages, Ollama, OpenAI Responses
and rerank.

openapi.py merges these into the document (SCHEMAS into components, OPERATIONS into the operations).
Each request schema lists the fields the translators read, with the types they accept; fields outside
it are ignored or refused with a 400 that names them. Answers list their required fields only where the
server always sends them.
"""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: dict[str, Any], stream: str | None = None, description: str = "OK") -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if stream:
        content[stream] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}
_STRINGS = {"type": "array", "items": _STR}
_STRING_OR_STRINGS = {"oneOf": [_STR, _STRINGS]}


# ---- Anthropic -----------------------------------------------------------------------------------
def _block(kind: str, required: list[str], **props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", *required],
        "properties": {"type": {"const": kind}, **props},
    }


_TEXT_BLOCK = _block("text", ["text"], text=_STR)
_ANTHROPIC_BLOCKS: dict[str, Any] = {
    "AnthropicTextBlock": _TEXT_BLOCK,
    "AnthropicImageBlock": _block(
        "image",
        ["source"],
        source={
            "oneOf": [
                {
                    "type": "object",
                    "required": ["type", "media_type", "data"],
                    "properties": {"type": {"const": "base64"}, "media_type": _STR, "data": _STR},
                },
                {
                    "type": "object",
                    "required": ["type", "url"],
                    "properties": {"type": {"const": "url"}, "url": _STR},
                },
            ]
        },
    ),
    "AnthropicToolUseBlock": _block("tool_use", ["id", "name", "input"], id=_STR, name=_STR, input=_OBJ),
    "AnthropicToolResultBlock": _block(
        "tool_result",
        ["tool_use_id"],
        tool_use_id=_STR,
        content={"oneOf": [_STR, {"type": "array", "items": _ref("AnthropicTextBlock")}]},
        is_error=_BOOL,
    ),
}


def _content(*blocks: str) -> dict[str, Any]:
    return {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_ref(b) for b in blocks]}}]}


_ANTHROPIC_MESSAGE = {
    "description": "A user turn (text, image, tool_result blocks) or an assistant turn (text, tool_use).",
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "user"},
                "content": _content("AnthropicTextBlock", "AnthropicImageBlock", "AnthropicToolResultBlock"),
            },
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"const": "assistant"},
                "content": _content("AnthropicTextBlock", "AnthropicToolUseBlock"),
            },
        },
    ],
}
_ANTHROPIC_TOOL = {
    "type": "object",
    "required": ["name", "input_schema"],
    "properties": {"name": _STR, "description": _STR, "input_schema": _OBJ},
}
_ANTHROPIC_PROMPT = {
    "model": {"type": "string", "description": "A model id from GET /v1/models."},
    "messages": {"type": "array", "minItems": 1, "items": _ref("AnthropicMessage")},
    "system": {"oneOf": [_STR, {"type": "array", "items": _ref("AnthropicTextBlock")}]},
    "tools": {"type": "array", "items": _ref("AnthropicTool")},
    "tool_choice": {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "none", "tool"]},
            "name": {"type": "string", "description": "With type 'tool': the tool that must be called."},
            "disable_parallel_tool_use": _BOOL,
        },
    },
    "thinking": {"type": "object", "properties": {"type": {"enum": ["enabled", "disabled", "adaptive"]}}},
}
_ANTHROPIC_USAGE = {
    "type": "object",
    "required": ["input_tokens", "output_tokens"],
    "properties": {"input_tokens": _INT, "output_tokens": _INT},
}

# ---- Ollama --------------------------------------------------------------------------------------
_KEEP_ALIVE = {
    "oneOf": [_STR, _NUM],
    "description": "How long the model stays loaded after this request: '5m', '1h', seconds, 0 unloads, "
    "a negative value keeps it loaded. Sets the lane's idle TTL.",
}
_OLLAMA_COMMON = {
    "model": {
        "type": "string",
        "description": "An Ollama name from GET /api/tags ('tiny' or 'tiny:latest').",
    },
    "stream": {"type": "boolean", "description": "NDJSON pieces unless false (the default is true)."},
    "format": {"oneOf": [{"const": "json"}, _OBJ, {"const": ""}]},
    "options": {
        "type": "object",
        "description": "Sampling options (temperature, top_p, top_k, seed, num_predict, stop, ...); "
        "load-time ones (num_ctx, num_gpu, ...) are ignored and named in X-Switchyard-Ignored-Options.",
    },
    "keep_alive": _KEEP_ALIVE,
    "think": {"oneOf": [_BOOL, _STR]},
}
_OLLAMA_DONE = {
    "model": _STR,
    "created_at": _STR,
    "done": _BOOL,
    "done_reason": _STR,
    "total_duration": _INT,
    "load_duration": _INT,
    "prompt_eval_count": _INT,
    "prompt_eval_duration": _INT,
    "eval_count": _INT,
    "eval_duration": _INT,
}

SCHEMAS: dict[str, Any] = {
    **_ANTHROPIC_BLOCKS,
    "AnthropicMessage": _ANTHROPIC_MESSAGE,
    "AnthropicTool": _ANTHROPIC_TOOL,
    "AnthropicMessagesRequest": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            **_ANTHROPIC_PROMPT,
            "max_tokens": {"type": "integer", "minimum": 1},
            "stop_sequences": _STRINGS,
            "temperature": _NUM,
            "top_p": _NUM,
            "top_k": _INT,
            "stream": _BOOL,
            "metadata": _OBJ,
            "grammar": {"type": "string", "description": "llama.cpp extension: a GBNF grammar."},
        },
    },
    "AnthropicCountTokensRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": _ANTHROPIC_PROMPT,
    },
    "AnthropicResponse": {
        "type": "object",
        "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
        "properties": {
            "id": _STR,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": _STR,
            "content": {
                "type": "array",
                "items": {"oneOf": [_ref("AnthropicTextBlock"), _ref("AnthropicToolUseBlock")]},
            },
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
            "stop_sequence": {"type": ["string", "null"]},
            "usage": _ANTHROPIC_USAGE,
        },
    },
    "AnthropicTokenCount": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": _INT},
    },
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
                        "content": _STR,
                        "images": _STRINGS,
                        "tool_calls": {"type": "array", "items": _OBJ},
                        "thinking": _STR,
                    },
                },
            },
            "tools": {"type": "array", "items": _OBJ},
        },
    },
    "OllamaGenerateRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {
            **_OLLAMA_COMMON,
            "prompt": {"type": "string", "description": "Empty or absent: load (or unload) the model."},
            "suffix": _STR,
            "system": _STR,
            "template": _STR,
            "raw": {"type": "boolean", "description": "The prompt as is, without the chat template."},
            "images": _STRINGS,
        },
    },
    "OllamaEmbedRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _STR,
            "input": _STRING_OR_STRINGS,
            "truncate": _BOOL,
            "dimensions": {"type": "integer", "minimum": 1},
            "options": _OBJ,
            "keep_alive": _KEEP_ALIVE,
        },
    },
    "OllamaEmbeddingsRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": _STR, "prompt": _STR, "options": _OBJ, "keep_alive": _KEEP_ALIVE},
    },
    "OllamaShowRequest": {
        "type": "object",
        "required": ["model"],
        "properties": {"model": _STR, "verbose": _BOOL},
    },
    "OllamaChatResponse": {
        "type": "object",
        "required": ["model", "created_at", "done"],
        "properties": {
            **_OLLAMA_DONE,
            "message": {
                "type": "object",
                "properties": {"role": _STR, "content": _STR, "thinking": _STR, "tool_calls": _OBJ},
            },
        },
    },
    "OllamaGenerateResponse": {
        "type": "object",
        "required": ["model", "created_at", "done"],
        "properties": {**_OLLAMA_DONE, "response": _STR, "thinking": _STR},
    },
    "OllamaEmbedResponse": {
        "type": "object",
        "required": ["model", "embeddings"],
        "properties": {
            "model": _STR,
            "embeddings": {"type": "array", "items": {"type": "array", "items": _NUM}},
            "total_duration": _INT,
            "load_duration": _INT,
            "prompt_eval_count": _INT,
        },
    },
    "OllamaEmbeddingResponse": {
        "type": "object",
        "required": ["embedding"],
        "properties": {"embedding": {"type": "array", "items": _NUM}},
    },
    "OllamaModel": {
        "type": "object",
        "required": ["name", "model", "size", "digest", "details"],
        "properties": {
            "name": _STR,
            "model": _STR,
            "modified_at": _STR,
            "size": _INT,
            "digest": _STR,
            "details": _OBJ,
            "expires_at": _STR,
            "size_vram": _INT,
            "context_length": _INT,
        },
    },
    "OllamaModelList": {
        "type": "object",
        "required": ["models"],
        "properties": {"models": {"type": "array", "items": _ref("OllamaModel")}},
    },
    "OllamaShowResponse": {
        "type": "object",
        "required": ["details", "model_info", "capabilities"],
        "properties": {
            "modelfile": _STR,
            "parameters": _STR,
            "template": _STR,
            "details": _OBJ,
            "model_info": _OBJ,
            "capabilities": _STRINGS,
            "modified_at": _STR,
        },
    },
    "ResponsesRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "description": "A chat model id from GET /v1/models."},
            "input": {
                "oneOf": [_STR, {"type": "array", "minItems": 1, "items": _ref("ResponsesInputItem")}],
                "description": "Text, or input items: messages, function_call, function_call_output.",
            },
            "instructions": _STR,
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": _NUM,
            "top_p": _NUM,
            "stream": _BOOL,
            "tools": {"type": "array", "items": _OBJ},
            "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, _OBJ]},
            "parallel_tool_calls": _BOOL,
            "text": {"type": "object", "properties": {"format": _OBJ}},
            "metadata": _OBJ,
            "store": _BOOL,
            "user": _STR,
            "grammar": {"type": "string", "description": "llama.cpp extension: a GBNF grammar."},
        },
    },
    "ResponsesInputItem": {
        "oneOf": [
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "type": {"const": "message"},
                    "role": {"enum": ["user", "assistant", "system", "developer"]},
                    "content": {
                        "oneOf": [
                            _STR,
                            {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["type", "text"],
                                    "properties": {
                                        "type": {"enum": ["input_text", "output_text"]},
                                        "text": _STR,
                                    },
                                },
                            },
                        ]
                    },
                },
            },
            {
                "type": "object",
                "required": ["type", "call_id", "name", "arguments"],
                "properties": {
                    "type": {"const": "function_call"},
                    "call_id": _STR,
                    "name": _STR,
                    "arguments": {"type": "string", "description": "JSON text."},
                },
            },
            {
                "type": "object",
                "required": ["type", "call_id", "output"],
                "properties": {"type": {"const": "function_call_output"}, "call_id": _STR, "output": _STR},
            },
        ]
    },
    "Response": {
        "type": "object",
        "required": ["id", "object", "created_at", "model", "status", "output"],
        "properties": {
            "id": _STR,
            "object": {"const": "response"},
            "created_at": _NUM,
            "model": _STR,
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
            "output": {"type": "array", "items": _OBJ},
            "usage": _OBJ,
            "error": {"type": ["object", "null"]},
            "incomplete_details": {"type": ["object", "null"]},
        },
    },
}

# ---- Rerank (Jina / Cohere shape) ----------------------------------------------------------------
_RERANK_DOC = {
    "oneOf": [_STR, {"type": "object", "required": ["text"], "properties": {"text": _STR}}],
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
        "model": _STR,
        "object": {"const": "list"},
        "results": {
            "type": "array",
            "description": "Sorted by relevance_score, best first.",
            "items": {
                "type": "object",
                "required": ["index", "relevance_score"],
                "properties": {
                    "index": {**_INT, "description": "The document's position in the request."},
                    "relevance_score": _NUM,
                    "document": {"type": "object", "properties": {"text": _STR}},
                },
            },
        },
        "usage": {"type": "object", "properties": {"prompt_tokens": _INT, "total_tokens": _INT}},
    },
}
_RERANK_OP = ("RerankRequest", _ok(_ref("RerankResponse")))

_SSE = "text/event-stream"
_NDJSON = "application/x-ndjson"
# (method, path) -> (request schema name or None, the 200 answer)
OPERATIONS: dict[tuple[str, str], tuple[str | None, dict[str, Any]]] = {
    ("POST", "/v1/messages"): (
        "AnthropicMessagesRequest",
        _ok(_ref("AnthropicResponse"), _SSE, "A message, or with `stream: true` Anthropic's named events"),
    ),
    ("POST", "/v1/messages/count_tokens"): ("AnthropicCountTokensRequest", _ok(_ref("AnthropicTokenCount"))),
    ("POST", "/v1/responses"): (
        "ResponsesRequest",
        _ok(_ref("Response"), _SSE, "A response, or with `stream: true` the Responses events"),
    ),
    ("GET", "/api/tags"): (None, _ok(_ref("OllamaModelList"))),
    ("GET", "/api/ps"): (None, _ok(_ref("OllamaModelList"))),
    ("POST", "/api/show"): ("OllamaShowRequest", _ok(_ref("OllamaShowResponse"))),
    ("POST", "/api/chat"): (
        "OllamaChatRequest",
        _ok(_ref("OllamaChatResponse"), _NDJSON, "NDJSON pieces, or with `stream: false` one answer"),
    ),
    ("POST", "/api/generate"): (
        "OllamaGenerateRequest",
        _ok(_ref("OllamaGenerateResponse"), _NDJSON, "NDJSON pieces, or with `stream: false` one answer"),
    ),
    ("POST", "/api/embed"): ("OllamaEmbedRequest", _ok(_ref("OllamaEmbedResponse"))),
    ("POST", "/api/embeddings"): ("OllamaEmbeddingsRequest", _ok(_ref("OllamaEmbeddingResponse"))),
    ("POST", "/v1/rerank"): _RERANK_OP,
    ("POST", "/rerank"): _RERANK_OP,
    ("POST", "/v2/rerank"): _RERANK_OP,
}
