"""The Chat page's MCP tools, offscreen, on the real Runtime: its in-process server, a real llama.cpp lane
and a real MCP server from the official SDK (tests/support/mcp_servers.py), registered as `switchyard mcp
add` does. The conversation picks the server in the Tools menu (kept in chat.db), a call that asks is
answered inline (Deny once, then Always allow, which writes the registry), and the call's card is folded
until it is opened. Screenshots at 1024x640 and 1600x1000, light and dark, go to SWITCHYARD_SCREENSHOT_DIR
(docs/screenshots refreshes chat-tools-*.png).

The random-weights model is made to call the tool as in tests/mcp/test_responses_mcp.py: a tools-aware
template, a named tool_choice and an assistant prefill, which is the page's Continue on a reply that
begins `<tool_call>`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import QUrl

from app.chat.store import ChatStore
from app.chat.tool_turns import SERVERS_KEY, TOOLS_META
from app.core.paths import Paths
from app.core.settings import Settings
from app.mcp.registry import McpRegistry
from tests.mcp.test_responses_mcp import _server_argv
from tests.support.mcp_servers import ANSWER
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf
from tests.support.ui_pictures import save

QUESTION = "weather in Paris?"
# the tool-calling request of tests/mcp/test_responses_mcp.py::_ask, as the conversation's sampling
CALLING = {
    "tool_choice": {"type": "mcp", "server_label": "wx", "name": "lookup"},
    "parallel_tool_calls": False,
    "max_tool_calls": 1,
}


async def _shots(desk: Any, out: Path, name: str) -> None:
    for theme in ("light", "dark"):
        desk.theme.set(theme)
        for width, height in ((1024, 640), (1600, 1000)):
            desk.window.resize(width, height)
            await asyncio.sleep(0.3)  # laid out and painted anew (no nested processEvents under qasync)
            save(desk.window, out / f"chat-tools-{name}-{width}-{theme}.png")
    desk.theme.set("light")
    desk.window.resize(1024, 640)


def test_chat_tools_pick_answer_and_cards(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = tmp_path / "models"
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    marker = tmp_path / "ran"
    registry = McpRegistry.of(Paths(home=isolated_env))
    registry.add("wx", command=_server_argv("good", marker), timeout_s=10)
    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)
    out = Path(os.environ.get("SWITCHYARD_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)

    async def reply(chat: Any, task: Any) -> None:
        assert task is not None, chat.status.text()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 120)

    def start(chat: Any, desk: Any, cid: int) -> int:
        """The question and a reply that begins the call, continued through the widgets' own link."""
        desk.chats.add(cid, "user", QUESTION)
        prefill = desk.chats.add(cid, "assistant", "<tool_call>\n")
        chat.open(cid)
        assert f"continue:{prefill}" in chat.view.toMarkdown(), "the last reply offers Continue"
        chat._link(QUrl(f"continue:{prefill}"))  # as a click on the link sends it
        return prefill

    def asked(desk: Any, cid: int) -> dict[str, Any]:
        msgs = desk.chats.messages(cid)
        replies = [m for m in msgs if m.role == "assistant"]
        assert TOOLS_META in replies[-1].meta, [(m.role, m.content[:300]) for m in msgs]
        (item,) = replies[-1].meta[TOOLS_META]
        assert item["type"] == "mcp_approval_request" and item["name"] == "lookup"
        assert json.loads(item["arguments"]) == {"city": "Paris"}
        return item

    async def scenario() -> int:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            desk.window.show()
            chat = desk.window.show_page("Chat")
            cid = chat.new_conversation(model="tools")
            desk.chats.rename(cid, "Weather (denied once)")
            chat.reload_list()
            assert chat.tools_btn.text() == "Tools"
            chat.tools_btn.fill()  # the menu as it opens: the registered servers
            (action,) = chat.tools_btn.menu().actions()
            assert action.text() == "wx" and not action.isChecked()
            action.setChecked(True)
            assert desk.chats.get(cid).sampling[SERVERS_KEY] == ["wx"]
            assert chat.tools_btn.text() == "Tools (1)"
            # llama.cpp's own sampling defaults, as the openai client's request leaves them
            chat.temperature.setValue(0.8)
            chat.top_p.setValue(0.95)
            chat.max_tokens.setValue(200)
            chat.seed.setValue(8)
            conv = desk.chats.get(cid)
            desk.chats.configure(cid, model="tools", system_prompt="", sampling={**conv.sampling, **CALLING})

            # 1. the tool asks (no permission set on this machine): Deny once
            start(chat, desk, cid)
            await reply(chat, chat.stream_task)
            item = asked(desk, cid)
            shown = chat.view.toPlainText()
            assert "wx · lookup asks to run" in shown
            assert "Allow once · Always allow · Deny · Always deny" in shown
            assert not marker.exists(), "nothing runs before the user answers"
            await _shots(desk, out, "ask")
            desk.chats.configure(
                cid,
                model="tools",
                system_prompt="",
                sampling={**desk.chats.get(cid).sampling, "tool_choice": "none"},
            )
            chat._link(QUrl(f"deny:{item['id']}"))
            await reply(chat, chat.stream_task)
            msgs = desk.chats.messages(cid)
            answered = [i for m in msgs for i in m.meta.get(TOOLS_META, []) if i["id"] == item["id"]]
            assert answered[0]["answer"] == "denied"
            assert not any(i["type"] == "mcp_call" for m in msgs for i in m.meta.get(TOOLS_META, []))
            assert not marker.exists(), "a denied call never reaches the server"
            assert 'lookup {"city": "Paris"}: denied' in chat.view.toPlainText()
            assert registry.get("wx").permission("lookup") == "ask", "once: the registry is unchanged"

            # 2. a new conversation: Always allow runs it and writes the registry
            cid2 = chat.new_conversation(model="tools")
            desk.chats.rename(cid2, "Weather (always allowed)")
            chat.reload_list()
            desk.chats.configure(cid2, model="tools", system_prompt="", sampling=desk.chats.get(cid).sampling)
            desk.chats.configure(
                cid2,
                model="tools",
                system_prompt="",
                sampling={**desk.chats.get(cid2).sampling, **CALLING},
            )
            start(chat, desk, cid2)
            await reply(chat, chat.stream_task)
            item = asked(desk, cid2)
            desk.chats.configure(
                cid2,
                model="tools",
                system_prompt="",
                sampling={**desk.chats.get(cid2).sampling, "tool_choice": "none"},
            )
            chat._link(QUrl(f"always:{item['id']}"))
            await reply(chat, chat.stream_task)
            assert registry.get("wx").permission("lookup") == "allow"
            assert marker.read_text().splitlines() == ["Paris"]
            last = [m for m in desk.chats.messages(cid2) if m.role == "assistant"][-1]
            (call,) = [i for i in last.meta[TOOLS_META] if i["type"] == "mcp_call"]
            assert call["output"] == ANSWER and call["approval_request_id"] == item["id"]
            folded = chat.view.toPlainText()
            assert f"Tool call wx · lookup: done, {len(ANSWER)} bytes" in folded and ANSWER not in folded
            chat._link(QUrl(f"tool:{call['id']}"))  # open the card
            opened = chat.view.toPlainText()
            assert ANSWER in opened and '{"city": "Paris"}' in opened
            await _shots(desk, out, "card")
            chat._link(QUrl(f"tool:{call['id']}"))
            assert ANSWER not in chat.view.toPlainText()

            chat.open(cid)  # each conversation shows its own servers
            assert chat.tools_btn.chosen == ["wx"]
            return cid2

    cid2 = qloop.run_until_complete(asyncio.wait_for(scenario(), 300))
    reopened = ChatStore(isolated_env / "chat.db")  # after the window closed: the servers are in chat.db
    try:
        assert reopened.get(cid2).sampling[SERVERS_KEY] == ["wx"]
    finally:
        reopened.close()
