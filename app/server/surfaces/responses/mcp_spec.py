"""The Responses API's `mcp` tool entries, checked, and which calls need the client's approval.

`{"type": "mcp", "server_label", "server_url"?, "allowed_tools"?, "require_approval"?, "headers"?}`: with
`server_url` the gateway speaks streamable HTTP to that URL; without it `server_label` names a server
registered on this machine (`switchyard mcp add`), whose per-tool permissions then also hold: `deny` never
runs, `ask` (the default) always asks the client, `allow` asks only where `require_approval` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.mcp.registry import McpServerSpec, check_url
from app.server.surfaces.openai.validate import bad as _bad

_IGNORED = ("server_description", "allowed_callers", "defer_loading")


@dataclass(frozen=True)
class McpToolEntry:
    label: str
    url: str | None  # None: the registered server named `label`
    allowed: frozenset[str] | None  # None: every tool the server lists
    always: frozenset[str] | None  # tools that need approval (None with never=None: all of them)
    never: frozenset[str]  # tools that run without approval (unless the machine says ask)
    default_approval: bool  # for a tool in neither set
    headers: dict[str, str] = field(default_factory=dict)
    read_only_never: bool = False  # require_approval.never.read_only: read-only tools run unasked

    def needs_approval(self, tool: str, *, read_only: bool) -> bool:
        if self.always is not None and tool in self.always:
            return True
        if tool in self.never or (self.read_only_never and read_only):
            return False
        return self.default_approval


def _names(value: Any, where: str) -> frozenset[str]:
    if isinstance(value, dict):
        value = value.get("tool_names", [])
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise _bad(f"{where} must be a list of tool names or {{'tool_names': [...]}}", where)
    return frozenset(value)


def parse_entry(tool: dict[str, Any], where: str) -> McpToolEntry:
    label = tool.get("server_label")
    if not isinstance(label, str) or not label:
        raise _bad(f"{where} needs a string 'server_label'", f"{where}.server_label")
    url = tool.get("server_url")
    if url is not None:
        if not isinstance(url, str):
            raise _bad(f"{where}.server_url must be a string", f"{where}.server_url")
        try:
            check_url(url)
        except Exception as exc:
            raise _bad(f"{where}.server_url: {exc}", f"{where}.server_url") from exc
    if tool.get("connector_id") is not None:
        raise _bad(f"{where}: connectors run on OpenAI's side; give a server_url or a registered name", where)
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise _bad(f"{where}.headers must map header names to strings", f"{where}.headers")
    if isinstance(tool.get("authorization"), str):
        headers = {**headers, "Authorization": f"Bearer {tool['authorization']}"}
    allowed = tool.get("allowed_tools")
    approval = tool.get("require_approval", "always")
    always: frozenset[str] | None = None
    never: frozenset[str] = frozenset()
    default, read_only = True, False
    if approval == "never":
        default = False
    elif approval == "always":
        default = True
    elif isinstance(approval, dict):
        if approval.get("always") is not None:
            always = _names(approval["always"], f"{where}.require_approval.always")
        if approval.get("never") is not None:
            never = _names(approval["never"], f"{where}.require_approval.never")
            read_only = isinstance(approval["never"], dict) and approval["never"].get("read_only") is True
        # a filter names exceptions: tools outside `always` run unasked when only `always` is given
        default = always is None
    else:
        raise _bad(
            f"{where}.require_approval must be 'always', 'never' or {{'always': ..., 'never': ...}}",
            f"{where}.require_approval",
        )
    return McpToolEntry(
        label=label,
        url=url,
        allowed=None if allowed is None else _names(allowed, f"{where}.allowed_tools"),
        always=always,
        never=never,
        default_approval=default,
        headers=dict(headers),
        read_only_never=read_only,
    )


def split_tools(tools: Any) -> tuple[list[Any], list[McpToolEntry]]:
    """(the tools that are not mcp, the mcp entries); labels must differ."""
    if not isinstance(tools, list):
        return tools, []
    rest: list[Any] = []
    entries: list[McpToolEntry] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            entries.append(parse_entry(tool, f"tools[{i}]"))
        else:
            rest.append(tool)
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise _bad("two mcp tools share a server_label; give each server its own label", "tools")
    return rest, entries


def adhoc_spec(entry: McpToolEntry) -> McpServerSpec:
    """A server given by URL in the request (not registered): no secrets kept, no machine permissions."""
    assert entry.url is not None
    return McpServerSpec(name=entry.label, url=entry.url)
