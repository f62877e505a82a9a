"""The Responses API's `tools` as chat tools the engine can run, and the names the client gets back.

Coding agents send more than plain function tools. Codex groups tools in `namespace` tools (function tools
nested under a name) and adds hosted tools (`web_search`) that run on OpenAI's side. Here a namespace is
flattened into function tools named `NAMESPACE__NAME` (a call to one is answered as `name` + `namespace`,
the form the client sent), and each tool that cannot run on a local server is left out on its own, named
in `ChatTools.dropped`; the request still runs with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.server.surfaces.openai.validate import bad as _bad

SEPARATOR = "__"
# tools OpenAI runs on its own servers (or the client's computer-use loop): nothing here can run them
HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer_use",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
    }
)


@dataclass(frozen=True)
class ChatTools:
    """The chat tools for the engine; engine name -> (namespace, name) for flattened tools; and the
    tools left out, as `type` or `type:name` strings the answer's notice lists."""

    tools: list[dict[str, Any]]
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    def client_name(self, engine_name: str) -> tuple[str, str | None]:
        """(name, namespace or None) of a call, as the client defined the tool."""
        if (found := self.namespaced.get(engine_name)) is not None:
            return found[1], found[0]
        return engine_name, None


def engine_name(name: str, namespace: str | None) -> str:
    """The flattened name a namespaced tool (or an earlier call to one) has on the engine's side."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _function(tool: dict[str, Any], where: str, *, name: str) -> dict[str, Any]:
    params = tool.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise _bad(f"{where}.parameters must be a JSON schema object", f"{where}.parameters")
    fn: dict[str, Any] = {"name": name, "parameters": params or {"type": "object", "properties": {}}}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    if isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def _name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where} needs a string 'name'", f"{where}.name")
    return name


def to_chat_tools(tools: Any) -> ChatTools:
    """Validate `tools`: function tools pass, namespaces flatten, hosted and custom tools are dropped."""
    if not isinstance(tools, list):
        raise _bad("field 'tools' must be a list of tool definitions", "tools")
    out: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{w} must be an object", w)
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool, w, name=_name(tool, w)))
        elif kind == "namespace":
            ns = _name(tool, w)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise _bad(f"{w}.tools must be a list of function tools", f"{w}.tools")
            for j, sub in enumerate(inner):
                sw = f"{w}.tools[{j}]"
                if not isinstance(sub, dict):
                    raise _bad(f"{sw} must be an object", sw)
                if sub.get("type") != "function":
                    dropped.append(f"{sub.get('type')}:{ns}.{sub.get('name')}")
                    continue
                flat = engine_name(_name(sub, sw), ns)
                namespaced[flat] = (ns, sub["name"])
                out.append(_function(sub, sw, name=flat))
        elif kind in HOSTED or kind == "custom":
            # a hosted tool runs on OpenAI's side, a custom (free-form) tool needs its grammar: left out
            # one by one, so an agent that offers them still gets its function tools
            dropped.append(str(kind) if kind != "custom" else f"custom:{tool.get('name')}")
        else:
            raise _bad(
                f"{w}: tool type {kind!r} is not available on a local model; define function tools "
                "({'type': 'function', 'name': ..., 'parameters': {...}}) or namespace tools",
                w,
            )
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise _bad(f"tools define {dup} more than once (namespaced tools count as NAMESPACE__NAME)", "tools")
    return ChatTools(tools=out, namespaced=namespaced, dropped=tuple(dropped))


def dropped_notice(dropped: tuple[str, ...]) -> dict[str, str]:
    """The response header that names the tools left out (empty when none were)."""
    if not dropped:
        return {}
    return {"Switchyard-Tools-Dropped": ", ".join(dropped)}
