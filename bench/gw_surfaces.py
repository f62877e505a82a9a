"""Request bodies and stream readers for each API surface the gateway benchmark sends requests to.

Every surface gets the same conversation and the same token budget. The OpenAI pass-through cases force
the length with llama.cpp's ``ignore_eos``; the Anthropic and Ollama translators do not forward that
field, so the translated cases force it with a grammar instead: exactly N lowercase letters. Every token
of the test vocabulary that matches ``[a-z]`` is a single character, so the grammar yields exactly N
tokens, one per event, and the model then stops (only end-of-stream is left), on every surface alike.
"""

from __future__ import annotations

import json
from typing import Any

SURFACES = ("openai", "anthropic", "responses", "ollama")
ROUTES = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
    "ollama": "/api/chat",
}
HEADERS = {
    "openai": {"Content-Type": "application/json"},
    "anthropic": {"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
    "responses": {"Content-Type": "application/json"},
    "ollama": {"Content-Type": "application/json"},
}
# what one line of a stream means to the client: content, the final token count, an error, or nothing
CONTENT, TOKENS, ERROR, OTHER = "content", "tokens", "error", ""


def _has(payload: bytes, key: str, value: str) -> bool:
    """`"key": value` in a JSON text, written compactly or with json.dumps' default spaces."""
    k = f'"{key}":'.encode()
    return k + value.encode() in payload or k + b" " + value.encode() in payload


def letters_grammar(n: int) -> str:
    """A GBNF grammar that admits exactly `n` lowercase letters."""
    return f"root ::= [a-z]{{{n}}}"


def openai_body(model: str, prompt: str, max_tokens: int, *, grammar: bool) -> dict[str, Any]:
    """The chat body the engine answers directly (and the gateway's OpenAI route passes through)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if grammar:
        body["grammar"] = letters_grammar(max_tokens)
    else:
        body["ignore_eos"] = True
    return body


def surface_body(surface: str, model: str, prompt: str, max_tokens: int, *, grammar: bool) -> bytes:
    """The equivalent streamed request on `surface`, as bytes ready to send."""
    if surface == "openai":
        return json.dumps(openai_body(model, prompt, max_tokens, grammar=grammar)).encode()
    if not grammar:
        raise ValueError(f"the {surface} surface cannot force a length without the grammar")
    g = letters_grammar(max_tokens)
    messages = [{"role": "user", "content": prompt}]
    body: dict[str, Any]
    if surface == "anthropic":
        body = {"model": model, "max_tokens": max_tokens, "messages": messages, "stream": True}
        body |= {"temperature": 0, "grammar": g}
    elif surface == "responses":
        body = {"model": model, "input": prompt, "max_output_tokens": max_tokens, "stream": True}
        body |= {"temperature": 0, "grammar": g}
    elif surface == "ollama":
        options = {"num_predict": max_tokens, "temperature": 0, "grammar": g}
        body = {"model": model, "messages": messages, "stream": True, "options": options}
    else:
        raise ValueError(f"unknown surface {surface!r}; pick one of {', '.join(SURFACES)}")
    return json.dumps(body).encode()


def classify(surface: str, line: bytes) -> tuple[str, int]:
    """What one stream line is: (CONTENT, 0), (TOKENS, n), (ERROR, 0) or (OTHER, 0).

    Byte tests first, so the client spends little CPU; only the line with the token count is parsed."""
    if surface == "ollama":
        return _ollama(line)
    if not line.startswith(b"data: "):
        return OTHER, 0
    payload = line[6:]
    if surface == "openai":
        if b'"content":"' in payload and b'"content":""' not in payload:
            return CONTENT, 0
        if b'"usage":{' in payload:
            return TOKENS, int(json.loads(payload)["usage"].get("completion_tokens") or 0)
        if b'"error"' in payload:
            return ERROR, 0
    elif surface == "anthropic":
        if b'"text_delta"' in payload:
            return CONTENT, 0
        if b'"message_delta"' in payload:
            return TOKENS, int((json.loads(payload).get("usage") or {}).get("output_tokens") or 0)
    elif surface == "responses":
        if b'"response.output_text.delta"' in payload:
            return CONTENT, 0
        if b'"response.completed"' in payload:
            usage = (json.loads(payload).get("response") or {}).get("usage") or {}
            return TOKENS, int(usage.get("output_tokens") or 0)
        if b'"response.failed"' in payload:
            return ERROR, 0
    if _has(payload, "type", '"error"'):
        return ERROR, 0
    return OTHER, 0


def _ollama(line: bytes) -> tuple[str, int]:
    if _has(line, "done", "false"):
        return (OTHER, 0) if _has(line, "content", '""') else (CONTENT, 0)
    if _has(line, "done", "true"):
        return TOKENS, int(json.loads(line).get("eval_count") or 0)
    if line.startswith(b'{"error"'):
        return ERROR, 0
    return OTHER, 0
