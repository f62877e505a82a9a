"""The Chat page's tool turns without Qt or a server (app/chat/tool_turns.py): which earlier items go back
as input, how the conversation's sampling becomes a Responses body, and the SSE reader's edges. The whole
path against a real server and MCP server is tests/ui/test_chat_tools.py."""

from __future__ import annotations

import pytest

from app.chat.client import ChatError
from app.chat.deltas import Text, Usage
from app.chat.tool_turns import (
    SERVERS_KEY,
    ToolItem,
    Turn,
    _events,
    _read,
    chat_sampling,
    responses_body,
    responses_input,
)

CALL = {"id": "mcp_1", "type": "mcp_call", "server_label": "wx", "name": "lookup", "arguments": "{}"}


def _ask(iid: str, answer: str | None = None) -> dict[str, object]:
    item = {
        "id": iid,
        "type": "mcp_approval_request",
        "server_label": "wx",
        "name": "lookup",
        "arguments": "{}",
    }
    return item | ({"answer": answer} if answer else {})


def test_only_the_last_replys_answered_approval_goes_back_with_its_answer() -> None:
    turns = [
        Turn("user", "one", [], []),
        Turn("assistant", "", [_ask("r1", "approved")], []),  # answered earlier: its call follows
        Turn("assistant", "it is sunny", [{**CALL, "approval_request_id": "r1"}], []),
        Turn("user", "two", [], ["data:image/png;base64,AAAA"]),
        Turn("assistant", "", [_ask("r2")], []),  # never answered: left out
        Turn("assistant", "", [_ask("r3", "denied")], []),  # answered now
    ]
    items = responses_input(turns)
    assert [i.get("type", i.get("role")) for i in items] == [
        "user",
        "mcp_call",
        "assistant",
        "user",
        "mcp_approval_request",
        "mcp_approval_response",
    ]
    assert items[3]["content"] == [
        {"type": "input_text", "text": "two"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    ]
    assert items[4]["id"] == "r3" and "answer" not in items[4], "the answer is ours, not an item field"
    assert items[5] == {"type": "mcp_approval_response", "approval_request_id": "r3", "approve": False}


def test_the_body_names_the_servers_and_renames_sampling() -> None:
    sampling = {SERVERS_KEY: ["wx", "fs"], "max_tokens": 64, "seed": 8, "reasoning_effort": "none"}
    body = responses_body(
        model="m", system_prompt="Be brief.", sampling=sampling, turns=[Turn("user", "hi", [], [])]
    )
    assert body["tools"] == [
        {"type": "mcp", "server_label": "wx", "require_approval": "never"},
        {"type": "mcp", "server_label": "fs", "require_approval": "never"},
    ]
    assert body["max_output_tokens"] == 64 and body["seed"] == 8 and "max_tokens" not in body
    assert body["reasoning"] == {"effort": "none"} and "reasoning_effort" not in body
    assert body["instructions"] == "Be brief." and body["stream"] is True and body["store"] is False
    assert SERVERS_KEY not in chat_sampling(sampling), "the servers are not a chat-completions field"


def test_the_sse_reader_skips_comments_and_keeps_partial_events() -> None:
    buffer = bytearray(
        b': loading the model\n\nevent: response.output_text.delta\ndata: {"type": "response.out'
    )
    assert _events(buffer) == []
    buffer += b'put_text.delta", "delta": "hi"}\n\n'
    (event,) = _events(buffer)
    assert _read(event) == [Text("hi")] and buffer == b""
    done = {"type": "response.output_item.done", "item": CALL}
    assert _read(done) == [ToolItem(CALL)]
    assert _read({"type": "response.output_item.done", "item": {"type": "mcp_list_tools"}}) == []
    usage = {"type": "response.incomplete", "response": {"usage": {"input_tokens": 5, "output_tokens": 7}}}
    assert _read(usage) == [Usage(prompt_tokens=5, completion_tokens=7)]
    with pytest.raises(ChatError, match="the engine died"):
        _read({"type": "response.failed", "response": {"error": {"message": "the engine died"}}})
