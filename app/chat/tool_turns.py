"""A chat turn with MCP tools, with no Qt in it: the Chat page's conversation as a POST /v1/responses with
`mcp` tools (the gateway lists the servers' tools, runs the calls and asks for approvals: one tool runner,
app/server/surfaces/responses/mcp_run.py), and its event stream read back as text, reasoning and tool items.

The conversation's servers are kept in its sampling under `mcp_servers` (chat.db keeps them across
restarts); each reply's tool items (`mcp_call`, `mcp_approval_request` with the user's answer) are kept in
its message's meta under `tools`, and go back to the server as input items in later turns.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp

from app.chat.client import ChatError
from app.chat.deltas import Reasoning, Text, Usage

SERVERS_KEY = "mcp_servers"
TOOLS_META = "tools"
KEPT_ITEMS = ("mcp_call", "mcp_approval_request")  # what a reply keeps of its output (listings are not)
# sampling keys named differently on the Responses API, and the ones it does not take
_RENAMED = {"max_tokens": "max_output_tokens"}
_DROPPED = {SERVERS_KEY, "reasoning_effort", "stream", "stream_options"}


@dataclass(frozen=True, slots=True)
class ToolItem:
    """An MCP output item, finished: an `mcp_call` (output or error) or an `mcp_approval_request`."""

    item: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of the conversation, as the Chat page keeps it."""

    role: str  # user | assistant
    content: str
    tools: list[dict[str, Any]]  # an assistant reply's tool items (meta["tools"])
    images: list[str]  # data: URLs of a user message's images


def servers_of(sampling: dict[str, Any]) -> list[str]:
    value = sampling.get(SERVERS_KEY)
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def chat_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """The sampling a chat-completions body takes: the conversation's servers are not a sampling field."""
    return {k: v for k, v in sampling.items() if k != SERVERS_KEY}


def responses_input(turns: list[Turn]) -> list[dict[str, Any]]:
    """The conversation as Responses input items. An approval answered in the last reply goes back with
    its `mcp_approval_response` (the server then runs or declines it); older answered approvals are history
    already told by the calls that followed them, and unanswered ones are left out."""
    last = max((i for i, t in enumerate(turns) if t.role == "assistant"), default=-1)
    out: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        if turn.role == "user":
            content: Any = turn.content
            if turn.images:
                content = [{"type": "input_text", "text": turn.content}] if turn.content else []
                content += [{"type": "input_image", "image_url": url} for url in turn.images]
            out.append({"role": "user", "content": content})
            continue
        for item in turn.tools:
            kind = item.get("type")
            if kind == "mcp_call":
                out.append(_sent(item))
            elif kind == "mcp_approval_request" and item.get("answer") and i == last:
                out.append(_sent(item))
                out.append(
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": item["id"],
                        "approve": item["answer"] == "approved",
                    }
                )
        if turn.content:
            out.append({"role": "assistant", "content": turn.content})
    return out


def _sent(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "answer"}  # the answer is ours, not an item field


def responses_body(
    *, model: str, system_prompt: str, sampling: dict[str, Any], turns: list[Turn]
) -> dict[str, Any]:
    """The request for one reply: the conversation's servers as `mcp` tools whose approval this machine's
    permissions decide (`require_approval: never` leaves it to them: ask, allow or deny per tool)."""
    body: dict[str, Any] = {"model": model, "input": responses_input(turns), "stream": True, "store": False}
    if system_prompt:
        body["instructions"] = system_prompt
    for key, value in sampling.items():
        if key not in _DROPPED:
            body[_RENAMED.get(key, key)] = value
    if isinstance(sampling.get("reasoning_effort"), str):
        body["reasoning"] = {"effort": sampling["reasoning_effort"]}
    body["tools"] = [
        {"type": "mcp", "server_label": name, "require_approval": "never"} for name in servers_of(sampling)
    ]
    return body


def _events(buffer: bytearray) -> list[dict[str, Any]]:
    """Whole SSE events taken off the front of `buffer` (comment lines, the loading phase, skipped)."""
    out: list[dict[str, Any]] = []
    while (end := buffer.find(b"\n\n")) >= 0:
        block = bytes(buffer[:end]).decode("utf-8", "replace")
        del buffer[: end + 2]
        data = "".join(line[5:].strip() for line in block.splitlines() if line.startswith("data:"))
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


async def stream_reply(
    url: str,
    body: dict[str, Any],
    *,
    session: aiohttp.ClientSession,
    headers: dict[str, str] | None = None,
) -> AsyncGenerator[Text | Reasoning | Usage | ToolItem, None]:
    """POST `body` to `url`/v1/responses and yield the reply as it streams: text, reasoning, each finished
    MCP item, and the usage at the end. A refusal or a failed response raises ChatError with its words."""
    try:
        async with session.post(f"{url.rstrip('/')}/v1/responses", json=body, headers=headers or {}) as resp:
            if resp.status != 200:
                raise ChatError(f"{_message(await resp.read())} (HTTP {resp.status})")
            buffer = bytearray()
            async for piece in resp.content.iter_any():
                buffer += piece.replace(b"\r\n", b"\n")
                for event in _events(buffer):
                    for out in _read(event):
                        yield out
    except aiohttp.ClientError as exc:
        raise ChatError(
            f"the local server did not answer ({exc}); check the Server page, then Regenerate"
        ) from exc


def _read(event: dict[str, Any]) -> list[Text | Reasoning | Usage | ToolItem]:
    kind = event.get("type")
    if kind == "response.output_text.delta":
        return [Text(str(event.get("delta", "")))]
    if kind == "response.reasoning_text.delta":
        return [Reasoning(str(event.get("delta", "")))]
    if kind == "response.output_item.done":
        item = event.get("item") or {}
        return [ToolItem(item)] if item.get("type") in KEPT_ITEMS else []
    if kind in ("response.completed", "response.incomplete"):
        usage = (event.get("response") or {}).get("usage") or {}
        return [Usage(prompt_tokens=usage.get("input_tokens"), completion_tokens=usage.get("output_tokens"))]
    if kind == "response.failed":
        error = (event.get("response") or {}).get("error") or {}
        raise ChatError(str(error.get("message") or "the response failed"))
    return []


def _message(payload: bytes) -> str:
    try:
        doc = json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace")
    err = doc.get("error") if isinstance(doc, dict) else None
    return str(err.get("message")) if isinstance(err, dict) and err.get("message") else str(doc)
