"""The engine side of the translated surfaces (Anthropic, Responses, Ollama): a lane's OpenAI endpoints.

llama.cpp speaks OpenAI only, so these surfaces build an OpenAI body, send it to the lane (a local engine
or a remote model) and read the answer back chunk by chunk (`sse_chunks`) while they write their own shape
to the client. A remote's refusals name the remote and carry `source: remote`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import BadRequestError, RemoteFailedError, SwitchyardError
from app.lanes.lane import Lane
from app.lanes.remote import AnyLane, RemoteLane

log = logging.getLogger("switchyard.translate")
_NO_TOTAL = aiohttp.ClientTimeout(total=None, sock_connect=10)


class EngineRefusedError(SwitchyardError):
    """The engine answered an error status; its message and status are kept."""

    type = "invalid_request_error"
    code = "engine_refused"
    source = "engine"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
        if status >= 500:
            self.type = "engine_error"


class RemoteRefusedError(EngineRefusedError):
    """A remote answered an error status; its message and status are kept, the code says whose it was
    (`remote_http_<status>`, as on the pass-through routes)."""

    source = "remote"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, status=status)
        self.code = f"remote_http_{status}"
        if status >= 500:
            self.type = "server_error"


def refusal(lane: AnyLane, *, status: int, data: bytes) -> EngineRefusedError:
    """An upstream error answer (`{"error": {"message": ...}}`, a string, or plain text) as an error that
    names who refused: the local engine, or the remote (and which model there)."""
    message = data.decode("utf-8", "replace").strip() or f"HTTP {status}"
    try:
        err = json.loads(data).get("error")
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    if isinstance(lane, RemoteLane):
        who = f"remote {lane.remote.name!r} (for {lane.model_id!r})"
        return RemoteRefusedError(f"{who} refused the request: {message}", status=status)
    who = f"the engine for {lane.model_id!r}"
    return EngineRefusedError(f"{who} refused the request: {message}", status=status)


def rewrap_error(status: int, data: bytes, *, who: str, source: str) -> web.Response:
    """Re-wrap an upstream error answer in our envelope, keeping its message, type, code and status.

    `who` opens the message ("the engine for 'tiny'"); `source` ("engine", "remote") says who failed."""
    message, etype, code = data.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}", None, None
    try:
        err = json.loads(data).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            etype, code = err.get("type"), err.get("code")
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    if not isinstance(etype, str):
        # the engine's own 5xx is an engine_error; a remote's is a server error on its side
        server_side = "engine_error" if source == "engine" else "server_error"
        etype = "invalid_request_error" if status < 500 else server_side
    body = {
        "error": {
            "message": f"{who} refused the request: {message}",
            "type": etype,
            "param": None,
            "code": code if isinstance(code, str) else f"{source}_http_{status}",
            "source": source,
        }
    }
    return web.json_response(body, status=status)


async def post(
    http: aiohttp.ClientSession, lane: AnyLane, path: str, body: dict[str, Any]
) -> aiohttp.ClientResponse:
    """POST `body` to the lane (a remote one gets its own model name and key); an error status is raised
    as EngineRefusedError (the answer is closed)."""
    # llama.cpp closes the connection after a streamed answer; once the stream is read to its end the
    # pool would keep that socket and hand it, dead, to the next request: ask for close instead
    headers = {"Connection": "close"} if body.get("stream") is True else {}
    headers.update(lane.auth_headers())
    body = {**body, "model": lane.served_name}
    for attempt in range(2):
        try:
            upstream = await http.post(lane.base_url + path, json=body, headers=headers, timeout=_NO_TOTAL)
            break
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            # llama.cpp closes a connection after a cut-off stream; if the pool hands that one out
            # before its close was seen, the request never reached the engine: retry once, fresh
            if attempt == 0:
                await asyncio.sleep(0.01)
                continue
            await asyncio.sleep(0.05)  # let the lane see the exit so the error names it
            raise lane.broken(exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)
            raise lane.broken(exc) from exc
    if upstream.status >= 400:
        try:
            data = await upstream.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise lane.broken(exc) from exc
        finally:
            upstream.close()
        if isinstance(lane, RemoteLane) and upstream.status in (401, 403):
            raise lane.remote.auth_failed(upstream.status)  # our key for it, not the client's, was refused
        raise refusal(lane, status=upstream.status, data=data)
    return upstream


async def post_json(http: aiohttp.ClientSession, lane: AnyLane, path: str, body: dict[str, Any]) -> Any:
    upstream = await post(http, lane, path, body)
    try:
        data = await upstream.read()
    except (aiohttp.ClientError, OSError) as exc:
        await asyncio.sleep(0.05)
        raise lane.broken(exc) from exc
    finally:
        upstream.close()
    try:
        return json.loads(data)
    except ValueError as exc:
        if isinstance(lane, RemoteLane):
            raise RemoteFailedError(
                f"remote {lane.remote.name!r} answered {path} for {lane.model_id!r} with something that is "
                f"not JSON; check that {lane.remote.spec.url} is an OpenAI-compatible API"
            ) from exc
        raise EngineRefusedError(
            f"the engine for {lane.model_id!r} answered {path} with something that is not JSON", status=502
        ) from exc


async def sse_chunks(upstream: aiohttp.ClientResponse, lane: AnyLane) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON objects of an OpenAI event stream, one per `data:` line, until `[DONE]`.

    A broken connection is the lane's crash; an `{"error": ...}` event is the engine's refusal."""
    buf = b""
    try:
        async for piece in upstream.content.iter_any():
            buf += piece
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if line.startswith(b"error:"):  # llama.cpp's way to fail after the headers went out
                    raise refusal(lane, status=500, data=line[6:].strip())
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, `event:` names
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    obj = json.loads(payload)
                except ValueError:
                    log.warning("engine for %s sent a stream line that is not JSON: %r", lane.model_id, line)
                    continue
                if isinstance(obj, dict) and "error" in obj and "choices" not in obj:
                    raise refusal(lane, status=500, data=payload)
                if isinstance(obj, dict):
                    yield obj
    except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError) as exc:
        await asyncio.sleep(0.05)
        raise lane.broken(exc) from exc


async def has_vision(http: aiohttp.ClientSession, lane: Lane) -> bool:
    """Whether the running engine has a multimodal projector loaded (llama.cpp's /props)."""
    try:
        async with http.get(lane.base_url + "/props", timeout=aiohttp.ClientTimeout(total=10)) as r:
            props = await r.json(content_type=None) if r.status == 200 else {}
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
        return False
    modalities = props.get("modalities") if isinstance(props, dict) else None
    return isinstance(modalities, dict) and bool(modalities.get("vision"))


async def count_prompt_tokens(http: aiohttp.ClientSession, lane: Lane, chat_body: dict[str, Any]) -> int:
    """Tokens the engine will see for this chat request: its template applied, then tokenized."""
    shape: dict[str, Any] = {
        k: chat_body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in chat_body
    }
    rendered = await post_json(http, lane, "/apply-template", shape)
    prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(prompt, str):
        raise EngineRefusedError(f"the engine for {lane.model_id!r} did not render the prompt", status=502)
    tokens = await post_json(http, lane, "/tokenize", {"content": prompt, "add_special": True})
    if not isinstance(tokens, dict) or not isinstance(tokens.get("tokens"), list):
        raise EngineRefusedError(f"the engine for {lane.model_id!r} did not tokenize the prompt", status=502)
    return len(tokens["tokens"])


async def prompt_tokens(http: aiohttp.ClientSession, lane: AnyLane, chat_body: dict[str, Any]) -> int:
    """Tokens the model will see for this chat request.

    A local engine renders and tokenizes it (count_prompt_tokens). A remote has no tokenizer route to rely
    on (vLLM's /tokenize sits outside /v1, a remote Switchyard has none), so it is asked for one token of
    answer to the same messages and tools: the `usage.prompt_tokens` it reports is what it counted."""
    if not isinstance(lane, RemoteLane):
        return await count_prompt_tokens(http, lane, chat_body)
    shape: dict[str, Any] = {
        k: chat_body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in chat_body
    }
    answer = await post_json(http, lane, "/v1/chat/completions", {**shape, "max_tokens": 1, "stream": False})
    usage = answer.get("usage") if isinstance(answer, dict) else None
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(n, int) or isinstance(n, bool):
        raise RemoteFailedError(
            f"remote {lane.remote.name!r} answered a chat completion for {lane.model_id!r} without "
            "usage.prompt_tokens, so its prompt tokens cannot be counted here; count them on the remote"
        )
    return n


def parse_arguments(text: str) -> dict[str, Any]:
    """Tool arguments as an object; text that is not a JSON object is kept under 'arguments'."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def pin_named_tool_choice(chat: dict[str, Any]) -> dict[str, Any] | None:
    """A chat body with a named tool_choice, as llama.cpp can honour it; None when there is none.

    llama.cpp takes tool_choice only as a string: `{"type": "function", "function": {"name": N}}`
    is dropped with a warning and the model may answer without a call. Offering only N and
    requiring a call is the same request in a form the engine enforces (with its tool grammar)."""
    choice = chat.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    tools = chat.get("tools")
    if not isinstance(name, str) or not isinstance(tools, list):
        return None
    keep = [
        t
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
    ]
    if not keep:
        raise BadRequestError(
            f"tool_choice names function {name!r}, which is not among 'tools'", param="tool_choice"
        )
    return {**chat, "tools": keep, "tool_choice": "required"}
