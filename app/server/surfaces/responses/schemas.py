"""The OpenAPI schemas of the OpenAI Responses surface."""

from __future__ import annotations

from typing import Any

from app.server.surfaces.schemas import (
    BOOL,
    NUM,
    OBJ,
    SSE,
    STR,
    Operation,
    ok,
    ref,
)

SCHEMAS: dict[str, Any] = {
    "ResponsesRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "description": "A chat model id from GET /v1/models."},
            "input": {
                "oneOf": [STR, {"type": "array", "minItems": 1, "items": ref("ResponsesInputItem")}],
                "description": "Text, or input items: messages, function_call, function_call_output.",
            },
            "instructions": STR,
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": NUM,
            "top_p": NUM,
            "stream": BOOL,
            "tools": {"type": "array", "items": OBJ},
            "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, OBJ]},
            "parallel_tool_calls": BOOL,
            "text": {"type": "object", "properties": {"format": OBJ}},
            "metadata": OBJ,
            "store": {
                "type": "boolean",
                "description": "Keep the response (default true) for previous_response_id and GET.",
            },
            "previous_response_id": {
                "type": "string",
                "description": "Continue a stored response: its conversation and output come before 'input'.",
            },
            "user": STR,
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
                            STR,
                            {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["type", "text"],
                                    "properties": {
                                        "type": {"enum": ["input_text", "output_text"]},
                                        "text": STR,
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
                    "call_id": STR,
                    "name": STR,
                    "arguments": {"type": "string", "description": "JSON text."},
                },
            },
            {
                "type": "object",
                "required": ["type", "call_id", "output"],
                "properties": {"type": {"const": "function_call_output"}, "call_id": STR, "output": STR},
            },
        ]
    },
    "Response": {
        "type": "object",
        "required": ["id", "object", "created_at", "model", "status", "output"],
        "properties": {
            "id": STR,
            "object": {"const": "response"},
            "created_at": NUM,
            "model": STR,
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
            "output": {"type": "array", "items": OBJ},
            "usage": OBJ,
            "error": {"type": ["object", "null"]},
            "incomplete_details": {"type": ["object", "null"]},
        },
    },
}
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/responses"): (
        "ResponsesRequest",
        ok(ref("Response"), SSE, "A response, or with `stream: true` the Responses events"),
    ),
    ("GET", "/v1/responses/{response_id}"): (None, ok(ref("Response"), description="A stored response")),
    ("DELETE", "/v1/responses/{response_id}"): (
        None,
        ok(
            {
                "type": "object",
                "properties": {"id": STR, "object": {"const": "response"}, "deleted": BOOL},
            },
            description="The stored response is gone",
        ),
    ),
}
