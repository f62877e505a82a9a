"""A stdio transport for MCP servers whose lines are bounded.

The SDK's stdio transport gathers a line of any length before parsing it, so a server that prints a
gigabyte without a newline grows the gateway's memory by a gigabyte. This one is the same protocol
(newline-delimited JSON-RPC on the child's stdin/stdout) with a cap per line: a longer line ends the
session with an error the call reports, and the server's process group is killed. stderr goes to a small
ring, quoted when the server dies.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp.types as types
from mcp.shared.message import SessionMessage

from app.core.errors import McpToolError

_GRACE_S = 1.0


@dataclass
class Trouble:
    """What broke a session, set by the transport the moment it sees it (the session's pending call
    then ends with this reason instead of waiting out its deadline)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""

    def set(self, why: str) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()


@dataclass(frozen=True)
class StdioCommand:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    max_line_bytes: int = 4 * 1024 * 1024


def _parse(line: bytes) -> SessionMessage | McpToolError:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        return McpToolError(
            f"the MCP server sent malformed JSON-RPC: {line[:120].decode('utf-8', 'replace')!r}"
        )


@contextlib.asynccontextmanager
async def bounded_stdio(
    cmd: StdioCommand, *, stderr_tail: collections.deque[str], trouble: Trouble
) -> AsyncIterator[tuple[Any, Any]]:
    """(read stream, write stream) of the server `cmd` starts; the process group is killed on exit."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    try:
        proc = await anyio.open_process(
            list(cmd.argv), env={**env, **cmd.env}, start_new_session=True, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise McpToolError(f"cannot start the MCP server {cmd.argv[0]!r}: {exc}") from exc
    read_w, read_r = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_w, write_r = anyio.create_memory_object_stream[SessionMessage](16)

    async def reader() -> None:
        assert proc.stdout is not None
        buf = bytearray()
        async with read_w:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for chunk in proc.stdout:
                    buf += chunk
                    while (nl := buf.find(b"\n")) >= 0:
                        line, buf = bytes(buf[:nl]), buf[nl + 1 :]
                        if not line.strip():
                            continue
                        msg = _parse(line)
                        if isinstance(msg, McpToolError):  # the session cannot tell which call it was
                            trouble.set(msg.message)
                        else:
                            await read_w.send(msg)
                    if len(buf) > cmd.max_line_bytes:
                        trouble.set(
                            f"the MCP server sent a message over {cmd.max_line_bytes} bytes; it was stopped "
                            "(the cap keeps the gateway's memory bounded)"
                        )
                        _kill(proc.pid)
                        return
            if proc.returncode is not None or not trouble.event.is_set():
                with anyio.move_on_after(0.5):
                    await proc.wait()
                if proc.returncode is not None and proc.returncode != 0:
                    trouble.set(f"the MCP server exited with status {proc.returncode}")

    async def errors() -> None:
        assert proc.stderr is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in proc.stderr:
                stderr_tail.extend(chunk.decode("utf-8", "replace").splitlines()[-20:])

    async def writer() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with write_r:
                async for msg in write_r:
                    data = msg.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await proc.stdin.send(data.encode())

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(errors)
        tg.start_soon(writer)
        try:
            yield read_r, write_w
        finally:
            with anyio.CancelScope(shield=True):
                await write_w.aclose()
                if proc.stdin is not None:
                    with contextlib.suppress(Exception):
                        await proc.stdin.aclose()
                with anyio.move_on_after(_GRACE_S):
                    await proc.wait()
                if proc.returncode is None:
                    _kill(proc.pid)
                with anyio.move_on_after(_GRACE_S):
                    await proc.aclose()  # its pipes closed and the process reaped, before the loop may end
            tg.cancel_scope.cancel()


def _kill(pid: int) -> None:
    """SIGKILL the server's process group (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(pid, signal.SIGKILL)
        else:  # Windows: the process alone
            os.kill(pid, signal.SIGTERM)
