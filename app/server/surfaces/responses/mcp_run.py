"""POST /v1/responses with `mcp` tools: list the servers' tools, let the model call them, run them, loop.

One response may take several engine turns. Per request:

1. Each `mcp` entry's server is opened (app/mcp/client.py, bounded) and listed: an `mcp_list_tools` item,
   or one with `error` when the server cannot be reached (its tools are then not offered).
2. Earlier items the client sends back in `input` become the conversation: an `mcp_call` is a call and its
   output; an `mcp_approval_request` answered by an `mcp_approval_response` runs now when approved (an
   `mcp_call` item with its `approval_request_id`), or tells the model the user declined; one whose
   `mcp_call` is in `input` too already ran (a later turn's history, often from previous_response_id).
3. Each engine turn streams as usual; a call to an MCP tool is not shown as a `function_call` but, after
   the turn, becomes an `mcp_call` (run, with `output` or `error`), or an `mcp_approval_request` (the
   response then ends; the client answers in its next request). The loop goes on while calls ran, up to
   `McpBounds.max_calls` calls, after which the model is asked without tools.

Every call (and every denial) is written to the audit database's `mcp_calls` table with who asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.chat.deltas import Delta, ToolCallPart
from app.core.errors import SwitchyardError
from app.mcp.calls import ToolCallLog, ToolCallRecord
from app.mcp.client import CallResult, McpBounds, McpSession, McpTool, first_error, open_session
from app.mcp.registry import McpRegistry, McpServerSpec
from app.server.gateway.safety_gate import GATE, check_request, gate_for
from app.server.keys import GATEWAY, RUNTIME
from app.server.request_keys import CLIENT, MODEL
from app.server.surfaces.base import OPENAI
from app.server.surfaces.openai.validate import bad as _bad
from app.server.surfaces.responses.mcp_spec import McpToolEntry, adhoc_spec
from app.server.surfaces.responses.translate import Event, ResponsesCall, ResponseTranslator, new_id, to_chat

log = logging.getLogger("switchyard.mcp")
_MCP_INPUT = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")


@dataclass(frozen=True)
class OfferedTool:
    entry: McpToolEntry
    server: McpServerSpec
    tool: McpTool
    registered: bool
    key: str | None = None  # the API key the request came with: its own rules win (registry.py)

    def machine_rule(self) -> str | None:
        """This machine's permission for the call (None: a server given by URL, which has none)."""
        return self.server.permission(self.tool.name, key=self.key) if self.registered else None

    def needs_approval(self) -> bool:
        read_only = bool((self.tool.annotations or {}).get("readOnlyHint"))
        if self.machine_rule() == "ask":
            return True
        return self.entry.needs_approval(self.tool.name, read_only=read_only)

    def denied(self) -> bool:
        return self.machine_rule() == "deny"


class McpTranslator(ResponseTranslator):
    """The Responses translator over several engine turns: calls to MCP tools are held back (and
    become mcp_call or mcp_approval_request items after the turn); usage adds up over the turns."""

    def __init__(self, *, engine_names: set[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.engine_names = engine_names
        self.held: dict[int, dict[str, str]] = {}  # engine index -> {"id", "name", "arguments"}
        self._totals = [0, 0]

    def feed(self, delta: Delta) -> list[Event]:
        if isinstance(delta, ToolCallPart) and (
            delta.index in self.held or (delta.index not in self._calls and delta.name in self.engine_names)
        ):
            got = self.held.setdefault(
                delta.index, {"id": delta.id or new_id("call"), "name": "", "arguments": ""}
            )
            got["name"] += delta.name or ""
            got["arguments"] += delta.arguments or ""
            return []
        return super().feed(delta)

    def end_turn(self) -> tuple[list[Event], list[dict[str, str]]]:
        """Close the turn's open item; (its events, the MCP calls held back)."""
        events = self._close("completed")
        held = [self.held[i] for i in sorted(self.held)]
        self.held, self._calls = {}, {}
        self._totals[0] += self.input_tokens or 0
        self._totals[1] += self.output_tokens if self.output_tokens is not None else self.pieces
        self.input_tokens = self.output_tokens = None
        self.pieces = 0
        return events, held

    def usage(self) -> dict[str, Any]:
        u = super().usage()
        inp, out = u["input_tokens"] + self._totals[0], u["output_tokens"] + self._totals[1]
        return {**u, "input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}

    def event(self, etype: str, **fields: Any) -> Event:
        return self._ev(etype, **fields)

    def add_item(self, item: dict[str, Any]) -> tuple[int, Event]:
        self.output.append(item)
        at = len(self.output) - 1
        return at, self._ev("response.output_item.added", output_index=at, item=json.loads(json.dumps(item)))

    def done_item(self, at: int) -> Event:
        return self._ev(
            "response.output_item.done", output_index=at, item=json.loads(json.dumps(self.output[at]))
        )


class McpRun:
    """One /v1/responses request with mcp tools (see the module docstring)."""

    def __init__(
        self,
        request: web.Request,
        body: dict[str, Any],
        *,
        entries: list[McpToolEntry],
        other_tools: list[Any],
        echo: dict[str, Any] | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.request = request
        self.stored_echo = echo or {}  # store and previous_response_id, as routes.py read them
        self.keep = keep
        self.body = body
        self.other_tools = other_tools  # the request's function (and namespace) tools, passed on as they are
        self.entries = entries
        self.bounds = McpBounds()
        self.sessions: dict[str, McpSession] = {}
        self.offered: dict[str, OfferedTool] = {}  # engine name -> tool
        self.calls_run = 0
        self.resp: web.StreamResponse | None = None
        self.calls_log = ToolCallLog(request.app[RUNTIME].paths.home / "audit.db")
        self.tr: McpTranslator | None = None
        self.client_calls = False  # the model called one of the client's own function tools

    # ---- the request ------------------------------------------------------------------------------
    async def respond(self) -> web.StreamResponse:
        model, stream = self.body.get("model"), self.body.get("stream") is True
        if not isinstance(model, str) or not model.strip():
            raise _bad("missing required field 'model'", "model")
        self.request[MODEL] = model
        cap = self.body.get("max_tool_calls")
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise _bad("'max_tool_calls' must be an integer of at least 1", "max_tool_calls")
            self.bounds = dataclasses.replace(self.bounds, max_calls=min(cap, self.bounds.max_calls))
        echo = {
            "tools": _redacted(self.body.get("tools") or []),
            "tool_choice": self.body.get("tool_choice") or "auto",
            **self.stored_echo,
        }
        tr = self.tr = McpTranslator(model=model, echo=echo, engine_names=set(), keep=self.keep)
        events: list[Event] = list(tr.start())
        if stream:
            self.resp = OPENAI.stream_response()
            await self.resp.prepare(self.request)
            await self._send(events)
            events = []
        try:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    for entry in self.entries:
                        events += await self._list(stack, entry)
                    await self._send(events)
                    events = []
                    input_items, events = await self._history()
                    await self._send(events)
                    await self._loop(input_items)
            except BaseExceptionGroup as group:  # raised through the SDK's task groups: the error inside
                raise first_error(group) from None
        except SwitchyardError as exc:
            if self.resp is None:
                raise
            await self._send(tr.fail(exc))
            await self.resp.write_eof()
            return self.resp
        if self.resp is not None:
            await self.resp.write_eof()
            return self.resp
        return web.json_response(tr.response())

    async def _send(self, events: list[Event]) -> None:
        if self.resp is not None and events:
            await self.resp.write(OPENAI.frame(events))

    # ---- listing ----------------------------------------------------------------------------------
    async def _list(self, stack: contextlib.AsyncExitStack, entry: McpToolEntry) -> list[Event]:
        tr = self.tr
        assert tr is not None
        registered = entry.url is None
        item: dict[str, Any] = {
            "id": new_id("mcpl"),
            "type": "mcp_list_tools",
            "server_label": entry.label,
            "tools": [],
        }
        at, added = tr.add_item(item)
        events = [added, tr.event("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=at)]
        try:
            spec = (
                McpRegistry.of(self.request.app[RUNTIME].paths).get(entry.label)
                if registered
                else adhoc_spec(entry)
            )
            session = await stack.enter_async_context(
                open_session(spec, bounds=self.bounds.for_server(spec), headers=entry.headers)
            )
            tools = await session.tools()
        except SwitchyardError as exc:  # said in the item; the model goes on without this server's tools
            item["error"] = exc.message
            events += [
                tr.event("response.mcp_list_tools.failed", item_id=item["id"], output_index=at),
                tr.done_item(at),
            ]
            return events
        self.sessions[entry.label] = session
        for tool in tools:
            if entry.allowed is not None and tool.name not in entry.allowed:
                continue
            item["tools"].append(tool.listed())
            self.offered[self._engine_name(entry.label, tool.name)] = OfferedTool(
                entry, spec, tool, registered, key=self.request.get(CLIENT)
            )
        tr.engine_names.update(self.offered)
        events += [
            tr.event("response.mcp_list_tools.completed", item_id=item["id"], output_index=at),
            tr.done_item(at),
        ]
        return events

    def _engine_name(self, label: str, tool: str) -> str:
        """The tool's name as the model sees it: its own, or `LABEL__NAME` where two servers share it."""
        clash = any(o.tool.name == tool and o.entry.label != label for o in self.offered.values())
        return f"{label}__{tool}" if clash else tool

    def _find(self, label: str, tool: str) -> tuple[str, OfferedTool] | None:
        for name, o in self.offered.items():
            if o.entry.label == label and o.tool.name == tool:
                return name, o
        return None

    # ---- earlier items ----------------------------------------------------------------------------
    async def _history(self) -> tuple[Any, list[Event]]:
        """`input` with mcp items as function calls and outputs the engine understands; approved calls run."""
        raw = self.body.get("input")
        if not isinstance(raw, list):
            return raw, []
        # an approval whose call already ran (its mcp_call, sent back too) is history, not a call to run
        ran = {
            i.get("approval_request_id")
            for i in raw
            if isinstance(i, dict) and i.get("type") == "mcp_call" and i.get("approval_request_id")
        }
        answers = {
            i.get("approval_request_id"): i
            for i in raw
            if isinstance(i, dict)
            and i.get("type") == "mcp_approval_response"
            and i.get("approval_request_id") not in ran
        }
        out: list[Any] = []
        events: list[Event] = []
        for item in raw:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind not in _MCP_INPUT:
                out.append(item)
            elif kind == "mcp_call":
                said = (
                    item.get("output") if item.get("error") is None else f"error: {json.dumps(item['error'])}"
                )
                out += _as_function_call(item.get("id") or new_id("call"), self._seen_name(item), said)
            elif kind == "mcp_approval_request" and (answer := answers.get(item.get("id"))) is not None:
                text = await self._answered(item, approve=answer.get("approve") is True)
                out += _as_function_call(str(item["id"]), self._seen_name(item), text)
        return out, events

    def _seen_name(self, item: dict[str, Any]) -> dict[str, Any]:
        """An earlier item with the name the model knows its tool by."""
        found = self._find(str(item.get("server_label")), str(item.get("name")))
        return {**item, "name": found[0]} if found else item

    async def _answered(self, item: dict[str, Any], *, approve: bool) -> str:
        found = self._find(str(item.get("server_label")), str(item.get("name")))
        args = str(item.get("arguments") or "{}")
        if found is None:
            return f"the tool {item.get('name')!r} is not offered in this request"
        _, offered = found
        if not approve:
            self._audit(offered, args, outcome="denied", error="declined by the client")
            return "The user declined this tool call."
        return await self._run_call(offered, args, approval_id=str(item["id"]))

    # ---- turns ------------------------------------------------------------------------------------
    async def _loop(self, input_items: Any) -> None:
        tr = self.tr
        assert tr is not None
        functions = [
            {
                "type": "function",
                "name": name,
                "description": o.tool.description or "",
                "parameters": o.tool.input_schema,
            }
            for name, o in self.offered.items()
        ]
        base = {k: v for k, v in self.body.items() if k not in ("tools", "input", "stream", "max_tool_calls")}
        base["tools"] = [*self.other_tools, *functions]
        base["input"] = input_items
        choice = base.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "mcp":
            hit = self._find(str(choice.get("server_label")), str(choice.get("name")))
            if hit is None and choice.get("name") is not None:
                raise _bad(
                    f"tool_choice names {choice.get('name')!r}, which its server does not offer",
                    "tool_choice",
                )
            base["tool_choice"] = {"type": "function", "name": hit[0]} if hit else "required"
        extra: list[dict[str, Any]] = []  # the turns this response added, as chat messages
        while True:
            if not base["tools"]:
                base.pop("tools")
                base.pop("tool_choice", None)
            rc = to_chat(base)
            tr.tools = rc.tools
            tr.echo |= {k: v for k, v in rc.echo.items() if k not in ("tools", "tool_choice")}
            rc.chat["messages"] += extra
            held = await self._turn(rc)
            if not held or tr.finish_reason == "length":  # a call cut by max_output_tokens is not run
                await self._send(tr.finish())
                return
            extra.append({"role": "assistant", "content": None, "tool_calls": [_chat_call(c) for c in held]})
            asked = False
            for call in held:
                text, asked_now = await self._handle(call)
                asked = asked or asked_now
                if text is not None:
                    extra.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if (
                asked or self.client_calls
            ):  # the client answers approvals, runs its own calls, then asks again
                await self._send(tr.finish())
                return
            base["tool_choice"] = "auto"  # a forced choice holds for the first turn only
            if self.calls_run >= self.bounds.max_calls:
                base["tools"] = []

    async def _turn(self, rc: ResponsesCall) -> list[dict[str, str]]:
        tr = self.tr
        assert tr is not None
        gw = self.request.app[GATEWAY]
        to = await gw.resolve(rc.model, "chat")
        self.request[MODEL] = to.model
        gate = gate_for(self.request, group="responses", model=to.model, body=rc.chat)
        if gate is not None:
            self.request[GATE] = gate
        await check_request(gate)  # tool output is untrusted input: the judge reads it with the rest
        body_bytes = len(json.dumps(rc.chat).encode())
        async with gw.hold(to) as target:
            await gw.check(
                target, rc.chat, route="chat", body_bytes=body_bytes, has_images=False, param="input"
            )
            upstream = await gw.post(target, "/v1/chat/completions", rc.chat, stream=True)
            try:
                async for delta in gw.deltas(target, upstream):
                    await self._send(tr.feed(delta))
            finally:
                upstream.close()
        self.client_calls = any(o["type"] == "function_call" for o in tr.output)
        events, held = tr.end_turn()
        await self._send(events)
        return held

    async def _handle(self, call: dict[str, str]) -> tuple[str | None, bool]:
        """(what the model hears, whether an approval was asked) for one held call."""
        tr = self.tr
        assert tr is not None
        offered = self.offered[call["name"]]
        args = call["arguments"] or "{}"
        if offered.denied():  # an mcp_call that failed, so the client sees why nothing ran
            who = f" for API key {offered.key!r}" if offered.key is not None else ""
            lift = f"`switchyard mcp allow {offered.entry.label} {offered.tool.name}" + (
                f" --key {offered.key}`" if offered.key is not None else "`"
            )
            why = f"the tool {offered.tool.name!r} is denied here{who} ({lift} lifts that)"
            return await self._run_call(offered, args, approval_id=None, refused=why), False
        if offered.needs_approval():
            item = {
                "id": new_id("mcpr"),
                "type": "mcp_approval_request",
                "server_label": offered.entry.label,
                "name": offered.tool.name,
                "arguments": args,
            }
            at, added = tr.add_item(item)
            await self._send([added, tr.done_item(at)])
            return None, True
        return await self._run_call(offered, args, approval_id=None), False

    async def _run_call(
        self, offered: OfferedTool, args: str, *, approval_id: str | None, refused: str | None = None
    ) -> str:
        """Run one call as an `mcp_call` item (its events sent as they happen); what the model hears.
        A `refused` call is not run: its item fails with that reason."""
        tr = self.tr
        assert tr is not None
        item: dict[str, Any] = {
            "id": new_id("mcp"),
            "type": "mcp_call",
            "status": "in_progress",
            "server_label": offered.entry.label,
            "name": offered.tool.name,
            "arguments": args,
            "approval_request_id": approval_id,
            "output": None,
            "error": None,
        }
        at, added = tr.add_item(item)
        await self._send(
            [
                added,
                tr.event(
                    "response.mcp_call_arguments.delta", item_id=item["id"], output_index=at, delta=args
                ),
                tr.event(
                    "response.mcp_call_arguments.done", item_id=item["id"], output_index=at, arguments=args
                ),
                tr.event("response.mcp_call.in_progress", item_id=item["id"], output_index=at),
            ]
        )
        self.calls_run += 1  # refused ones count too: the bound is on what the model asks for
        if refused is not None:
            self._audit(offered, args, outcome="denied", error=refused)
            result = CallResult(output=None, error=refused, seconds=0.0, size=0)
        else:
            result = await self._call(offered, args)
        if result.error is None:
            item |= {"status": "completed", "output": result.output}
            ended = "response.mcp_call.completed"
        else:
            item |= {
                "status": "failed",
                "error": {"type": "mcp_protocol_error", "code": -32000, "message": result.error},
            }
            ended = "response.mcp_call.failed"
        await self._send([tr.event(ended, item_id=item["id"], output_index=at), tr.done_item(at)])
        return (result.output or "") if result.error is None else f"error: {result.error}"

    async def _call(self, offered: OfferedTool, args: str) -> CallResult:
        if self.calls_run > self.bounds.max_calls:
            result = CallResult(
                None, f"over the cap of {self.bounds.max_calls} MCP calls per response", 0.0, 0
            )
        else:
            try:
                parsed = json.loads(args)
                if not isinstance(parsed, dict):
                    raise ValueError("not an object")
            except ValueError:
                result = CallResult(
                    None, f"the model's arguments are not a JSON object: {args[:200]}", 0.0, 0
                )
            else:
                session = self.sessions[offered.entry.label]
                result = await session.call(offered.tool.name, parsed)
        self._audit(
            offered,
            args,
            outcome="ok" if result.error is None else "error",
            seconds=result.seconds,
            size=result.size,
            error=result.error,
        )
        return result

    def _audit(
        self,
        offered: OfferedTool,
        args: str,
        *,
        outcome: str,
        seconds: float = 0.0,
        size: int = 0,
        error: str | None = None,
    ) -> None:
        record = ToolCallRecord(
            model=self.request.get(MODEL, ""),
            server=offered.entry.label,
            tool=offered.tool.name,
            arguments=args,
            outcome=outcome,
            seconds=seconds,
            result_bytes=size,
            key_name=self.request.get(CLIENT),
            error=error,
        )
        try:
            self.calls_log.add(record)
        except Exception:  # the audit database locked or gone: the call's answer still goes out
            log.exception("could not write the MCP call to the audit log")


def _chat_call(call: dict[str, str]) -> dict[str, Any]:
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"] or "{}"},
    }


def _as_function_call(call_id: str, item: dict[str, Any], output: Any) -> list[dict[str, Any]]:
    """An earlier MCP call as the function_call / function_call_output pair to_chat reads."""
    text = output if isinstance(output, str) else json.dumps(output)
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": str(item.get("name")),
            "arguments": str(item.get("arguments") or "{}"),
        },
        {"type": "function_call_output", "call_id": call_id, "output": text},
    ]


def _redacted(tools: list[Any]) -> list[Any]:
    """The request's tools as the response echoes them: an mcp tool's header values and authorization are
    credentials, never written back (nor into a log that keeps responses)."""
    out: list[Any] = []
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "mcp":
            t = dict(t)
            if isinstance(t.get("headers"), dict):
                t["headers"] = {k: "<redacted>" for k in t["headers"]}
            if t.get("authorization") is not None:
                t["authorization"] = "<redacted>"
        out.append(t)
    return out
