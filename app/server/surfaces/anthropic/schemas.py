"""The OpenAPI schemas of the Anthropic surface: Messages and the token count (app/server/openapi.py
assembles them from SURFACES)."""

from __future__ import annotations

from typing import Any

from app.server.surfaces.schemas import (
    BOOL,
    INT,
    NUM,
    OBJ,
    SSE,
    STR,
    STRINGS,
    Operation,
    ok,
    ref,
)


# ---- Anthropic -----------------------------------------------------------------------------------
def _block(kind: str, required: list[str], **props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", *required],
        "properties": {"type": {"const": kind}, **props},
    }


_TEXT_BLOCK = _block("text", ["text"], text=STR)
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
                    "properties": {"type": {"const": "base64"}, "media_type": STR, "data": STR},
                },
                {
                    "type": "object",
                    "required": ["type", "url"],
                    "properties": {"type": {"const": "url"}, "url": STR},
                },
            ]
        },
    ),
    "AnthropicToolUseBlock": _block("tool_use", ["id", "name", "input"], id=STR, name=STR, input=OBJ),
    "AnthropicToolResultBlock": _block(
        "tool_result",
        ["tool_use_id"],
        tool_use_id=STR,
        content={"oneOf": [STR, {"type": "array", "items": ref("AnthropicTextBlock")}]},
        is_error=BOOL,
    ),
}


def _content(*blocks: str) -> dict[str, Any]:
    return {"oneOf": [STR, {"type": "array", "items": {"oneOf": [ref(b) for b in blocks]}}]}


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
    "properties": {"name": STR, "description": STR, "input_schema": OBJ},
}
_ANTHROPIC_PROMPT = {
    "model": {"type": "string", "description": "A model id from GET /v1/models."},
    "messages": {"type": "array", "minItems": 1, "items": ref("AnthropicMessage")},
    "system": {"oneOf": [STR, {"type": "array", "items": ref("AnthropicTextBlock")}]},
    "tools": {"type": "array", "items": ref("AnthropicTool")},
    "tool_choice": {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "none", "tool"]},
            "name": {"type": "string", "description": "With type 'tool': the tool that must be called."},
            "disable_parallel_tool_use": BOOL,
        },
    },
    "thinking": {"type": "object", "properties": {"type": {"enum": ["enabled", "disabled", "adaptive"]}}},
}
_ANTHROPIC_USAGE = {
    "type": "object",
    "required": ["input_tokens", "output_tokens"],
    "properties": {"input_tokens": INT, "output_tokens": INT},
}

SCHEMAS: dict[str, Any] = {
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
    **_ANTHROPIC_BLOCKS,
    "AnthropicMessage": _ANTHROPIC_MESSAGE,
    "AnthropicTool": _ANTHROPIC_TOOL,
    "AnthropicMessagesRequest": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            **_ANTHROPIC_PROMPT,
            "max_tokens": {"type": "integer", "minimum": 1},
            "stop_sequences": STRINGS,
            "temperature": NUM,
            "top_p": NUM,
            "top_k": INT,
            "stream": BOOL,
            "metadata": OBJ,
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
            "id": STR,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": STR,
            "content": {
                "type": "array",
                "items": {"oneOf": [ref("AnthropicTextBlock"), ref("AnthropicToolUseBlock")]},
            },
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
            "stop_sequence": {"type": ["string", "null"]},
            "usage": _ANTHROPIC_USAGE,
        },
    },
    "AnthropicTokenCount": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": INT},
    },
}
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/messages"): (
        "AnthropicMessagesRequest",
        ok(ref("AnthropicResponse"), SSE, "A message, or with `stream: true` Anthropic's named events"),
    ),
    ("POST", "/v1/messages/count_tokens"): ("AnthropicCountTokensRequest", ok(ref("AnthropicTokenCount"))),
}
