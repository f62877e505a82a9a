"""The Chat page's MCP tools: which registered servers a conversation uses, and each call as a card.

A conversation's servers are picked from `switchyard mcp ls`'s list in the Tools menu and kept in its
sampling (app/chat/tool_turns.py); a reply with servers goes through the server's /v1/responses `mcp` tool,
which runs the calls. Each call is a card under the reply, folded to one line (server, tool, outcome) that
opens to show its arguments and result or error. A call this machine asks about is a card with Allow once,
Always allow, Deny and Always deny: "always" writes the tool's permission into the MCP registry.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QMenu, QPushButton

FOLD = "tool"  # tool:ITEM_ID opens or closes a card
# link scheme -> (the answer kept on the item, the permission written, the link's label, the words after)
ANSWERS = {
    "approve": ("approved", None, "Allow once", "allowed once"),
    "always": ("approved", "allow", "Always allow", "always allowed"),
    "deny": ("denied", None, "Deny", "denied"),
    "never": ("denied", "deny", "Always deny", "always denied"),
}
SHOWN_CHARS = 2000  # of a result, in an open card


class ToolsButton(QPushButton):
    """The Tools menu: one checkable entry per registered MCP server; `changed` is told the checked names."""

    def __init__(self, *, registered: Callable[[], list[str]], changed: Callable[[list[str]], None]) -> None:
        super().__init__()
        self.registered = registered
        self.on_change = changed
        self.chosen: list[str] = []
        # a push button reserves room for its menu arrow (a tool button drew it over "Tools (1)")
        self.setMenu(QMenu(self))
        menu = self.menu()
        assert menu is not None
        menu.aboutToShow.connect(self.fill)
        self._label()

    def fill(self) -> None:
        """The menu, from the registry as it is now (a server added by the CLI shows without a restart)."""
        menu = self.menu()
        assert menu is not None
        menu.clear()
        names = self.registered()
        for name in sorted(set(names) | set(self.chosen)):
            action = menu.addAction(name if name in names else f"{name} (no longer registered)")
            action.setCheckable(True)
            action.setChecked(name in self.chosen)
            action.toggled.connect(lambda on, n=name: self.pick(n, on=on))
        if not names and not self.chosen:
            # the window has no form to register a server (its command, its secrets): the guide does
            hint = menu.addAction("No MCP tool servers on this machine yet: docs/mcp.md shows how to add one")
            hint.setEnabled(False)

    def pick(self, name: str, *, on: bool) -> None:
        chosen = [n for n in self.chosen if n != name] + ([name] if on else [])
        self.show_servers(sorted(chosen))
        self.on_change(self.chosen)

    def show_servers(self, names: list[str]) -> None:
        """Show a conversation's servers (without counting as a change)."""
        self.chosen = list(names)
        self._label()

    def _label(self) -> None:
        self.setText(f"Tools ({len(self.chosen)})" if self.chosen else "Tools")
        self.setToolTip(
            "MCP servers this conversation's model may call: "
            + (", ".join(self.chosen) if self.chosen else "none")
            + ". Each call shows as a card under the reply; tools that ask show Allow and Deny there."
        )


def cards(items: list[dict[str, Any]], *, unfolded: set[str], latest: bool) -> str:
    """Markdown for a reply's tool items, above its text. `latest`: this is the last reply, so a question
    still open there can be answered (older ones are shown as not answered)."""
    return "".join(_card(item, unfolded=item.get("id") in unfolded, latest=latest) for item in items)


def _card(item: dict[str, Any], *, unfolded: bool, latest: bool) -> str:
    iid = str(item.get("id"))
    what = f"{item.get('server_label')} · {item.get('name')}"
    args = _one_line(str(item.get("arguments") or "{}"))
    if item.get("type") == "mcp_approval_request":
        answer = item.get("answer")
        if answer:
            said = item.get("said") or answer
            return f"*Tool call {what} {args}: {html.escape(str(said))}*\n\n"
        if not latest:
            return f"*Tool call {what} {args}: not answered*\n\n"
        links = " · ".join(f"[{label}]({scheme}:{iid})" for scheme, (_, _, label, _) in ANSWERS.items())
        return f"**{what} asks to run** with `{args}`\n\n{links}\n\n"
    error = item.get("error")
    output = item.get("output")
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        outcome, shown = "failed", str(message)
    else:
        outcome, shown = f"done, {len(str(output or '').encode())} bytes", str(output or "")
    head = f"[{'▾' if unfolded else '▸'} Tool call {what}: {outcome}]({FOLD}:{iid})"
    if not unfolded:
        return f"{head}\n\n"
    if len(shown) > SHOWN_CHARS:
        shown = shown[:SHOWN_CHARS] + f"… ({len(shown) - SHOWN_CHARS} more characters)"
    label = "Error" if error else "Result"
    body = "\n".join(f"> {html.escape(line)}" if line.strip() else ">" for line in shown.splitlines())
    return f"{head}\n\n> **Arguments** `{args}`\n>\n> **{label}**\n>\n{body or '> (empty)'}\n\n"


def _one_line(arguments: str) -> str:
    """The arguments as compact JSON on one line (as sent, when they are not JSON)."""
    try:
        text = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        text = arguments
    return text.replace("`", "'")
