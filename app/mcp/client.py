"""One bounded session with an MCP server, through the official `mcp` SDK's `Client`.

Bounds (`McpBounds`) hold whatever the server does: connecting and listing have a deadline, each call has
one, a result over `max_result_bytes` is refused, and a server that crashes, hangs or sends malformed
JSON-RPC ends the call with `McpToolError` (said to the model and the client as the call's error) instead
of holding the request. A session is opened per request and closed with it (a stdio server's process group
is killed on close).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from app.core.errors import McpToolError
from app.mcp.registry import McpServerSpec
from app.mcp.stdio import StdioCommand, Trouble, bounded_stdio


@dataclass(frozen=True)
class McpBounds:
    connect_s: float = 30.0  # start (a Python server takes seconds to import on a busy machine) + list
    call_s: float = 30.0  # one tools/call
    max_result_bytes: int = 256 * 1024  # a tool's text output, as the model would read it
    max_calls: int = 8  # tool calls per response

    def for_server(self, spec: McpServerSpec) -> McpBounds:
        """These bounds with the server's own call deadline, where it has one."""
        return self if spec.timeout_s is None else dataclasses.replace(self, call_s=spec.timeout_s)


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None

    def listed(self) -> dict[str, Any]:
        """As an `mcp_list_tools` item lists it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
        }


@dataclass(frozen=True)
class CallResult:
    output: str | None
    error: str | None
    seconds: float
    size: int  # bytes of the output (or of the refused output)


@dataclass
class McpSession:
    """An open session; `tools()` and `call()` are bounded by `bounds`."""

    label: str
    client: Client
    bounds: McpBounds
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))
    trouble: Trouble = field(default_factory=Trouble)
    dead: str | None = None  # why a later call fails at once: the server broke or hung earlier

    async def _bounded(self, coro: Any, *, seconds: float, what: str) -> Any:
        """`coro` within `seconds`, ended early when the transport breaks (malformed JSON-RPC, a crash)."""
        task = asyncio.ensure_future(coro)
        watch = asyncio.ensure_future(self.trouble.event.wait())
        try:
            done, _ = await asyncio.wait({task, watch}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if task in done and not self.trouble.event.is_set():
            try:
                return task.result()
            except McpToolError:
                raise
            except Exception as exc:  # the SDK's McpError, a closed stream: the server broke
                raise McpToolError(f"MCP server {self.label!r}: {what} failed: {_reason(exc, self)}") from exc
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self.trouble.event.is_set():
            raise McpToolError(f"MCP server {self.label!r}: {what} failed: {self.trouble.why}")
        raise McpToolError(f"MCP server {self.label!r}: {what} gave no answer within {seconds:g} s")

    async def tools(self) -> list[McpTool]:
        listed = await self._bounded(
            self.client.list_tools(), seconds=self.bounds.connect_s, what="tools/list"
        )
        return [
            McpTool(
                name=t.name,
                description=t.description,
                input_schema=dict(t.input_schema or {"type": "object", "properties": {}}),
                annotations=t.annotations.model_dump(exclude_none=True) if t.annotations else None,
            )
            for t in listed.tools
        ]

    async def call(self, tool: str, arguments: dict[str, Any]) -> CallResult:
        """Run `tool`; every failure (the tool's own error included) is a CallResult with `error`."""
        t0 = time.perf_counter()
        if self.dead is not None:
            return CallResult(output=None, error=self.dead, seconds=0.0, size=0)
        try:
            res: types.CallToolResult = await self._bounded(
                self.client.call_tool(tool, arguments), seconds=self.bounds.call_s, what=f"calling {tool!r}"
            )
        except McpToolError as exc:
            if self.trouble.event.is_set() or "no answer within" in exc.message:
                self.dead = f"{exc.message} (earlier in this response; not asked again)"
            return CallResult(output=None, error=exc.message, seconds=time.perf_counter() - t0, size=0)
        text = result_text(res)
        size = len(text.encode())
        took = time.perf_counter() - t0
        if size > self.bounds.max_result_bytes:
            return CallResult(
                output=None,
                error=f"the result of {tool!r} is {size} bytes, over the cap of "
                f"{self.bounds.max_result_bytes}",
                seconds=took,
                size=size,
            )
        if res.is_error:
            return CallResult(output=None, error=text or f"{tool!r} failed", seconds=took, size=size)
        return CallResult(output=text, error=None, seconds=took, size=size)


def result_text(res: types.CallToolResult) -> str:
    """A call's content as text: text parts joined; other parts (images, resources) as their JSON."""
    parts: list[str] = []
    for c in res.content:
        if isinstance(c, types.TextContent):
            parts.append(c.text)
        else:
            parts.append(json.dumps(c.model_dump(mode="json", exclude_none=True)))
    if not parts and res.structured_content is not None:
        parts.append(json.dumps(res.structured_content))
    return "\n".join(parts)


def _reason(exc: BaseException, session: McpSession) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # from the SDK's task groups
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if session.stderr:
        text += f" (its last stderr line: {session.stderr[-1][:200]})"
    return text


@contextlib.asynccontextmanager
async def open_session(
    spec: McpServerSpec, *, bounds: McpBounds, headers: dict[str, str] | None = None
) -> AsyncIterator[McpSession]:
    """A session with `spec`'s server, closed (and a stdio server stopped) on exit; raises McpToolError
    when it cannot be started or connected within `bounds.connect_s`."""
    stderr: collections.deque[str] = collections.deque(maxlen=20)
    trouble = Trouble()

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):  # a transport's fault (the HTTP one reports them here)
            trouble.set(str(message) or type(message).__name__)

    try:
        async with contextlib.AsyncExitStack() as stack:
            if spec.command:
                cmd = StdioCommand(
                    argv=spec.command,
                    env={k: v.reveal() for k, v in spec.env.items()},
                    max_line_bytes=bounds.max_result_bytes * 4 + 64 * 1024,  # JSON escaping, other fields
                )
                transport: Any = bounded_stdio(cmd, stderr_tail=stderr, trouble=trouble)
            else:
                assert spec.url is not None
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers={**{k: v.reveal() for k, v in spec.headers.items()}, **(headers or {})},
                        timeout=httpx2.Timeout(bounds.call_s, connect=bounds.connect_s),
                    )
                )
                transport = streamable_http_client(
                    spec.url, http_client=http, max_sse_event_size=bounds.max_result_bytes * 4 + 64 * 1024
                )
            client = Client(
                # no SDK timeout: the handshake is bounded by connect_s below, each request by _bounded
                transport,
                message_handler=on_message,
                mode="legacy",
            )
            session = McpSession(
                label=spec.name, client=client, bounds=bounds, stderr=stderr, trouble=trouble
            )
            try:
                async with asyncio.timeout(bounds.connect_s):
                    await stack.enter_async_context(client)
            except TimeoutError as exc:
                raise McpToolError(
                    f"MCP server {spec.name!r} did not finish its handshake within {bounds.connect_s:g} s"
                ) from exc
            except McpToolError:
                raise
            except Exception as exc:
                raise McpToolError(
                    f"cannot connect to MCP server {spec.name!r}: {_reason(exc, session)}"
                ) from exc
            yield session
    except BaseExceptionGroup as group:  # the SDK's task groups wrap what the body raised: the error itself
        raise first_error(group) from None


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first error in a (nested) exception group."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    return leaf
