"""Request limits: body size and read time, concurrent requests per client, prompt length.

The middleware runs innermost (after the auth middleware has named the client): it refuses a body over
`max_body_mib` (413), a client already running `max_concurrent_per_client` requests (429 with
Retry-After), and a body that has not fully arrived within `body_timeout_s` (408). Idle connections and
request heads that never complete are closed by aiohttp itself after `idle_timeout_s` (see `serve`).

`check_prompt` refuses a chat or completion prompt that the lane's per-request context cannot hold, the
way llama.cpp would (it refuses a prompt of n_ctx_slot tokens or more), but with the counts and what to
change. Counting costs two calls to the engine, so it is done only when the body is large enough that
the prompt might not fit (`may_exceed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from app.core.errors import (
    ContextLengthExceededError,
    RequestTimeoutError,
    RequestTooLargeError,
    SwitchyardError,
    TooManyRequestsError,
)
from app.core.settings import Settings
from app.lanes.lane import Lane
from app.server.request_keys import CLIENT
from app.server.translate_anthropic import error_body as anthropic_error_body
from app.server.translate_engine import count_prompt_tokens, post_json

log = logging.getLogger("switchyard.limits")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIB = 1024 * 1024
RETRY_AFTER_S = 1
# a token covers at least one byte of the request body; the chat template adds at most this much
TEMPLATE_ALLOWANCE = 512
PER_MESSAGE_ALLOWANCE = 32


def error_response(
    request: web.Request, exc: SwitchyardError, *, headers: dict[str, str] | None = None
) -> web.Response:
    """`exc` in the error shape of the surface the route belongs to (OpenAI, Anthropic or Ollama)."""
    module = getattr(request.match_info.handler, "__module__", "") or ""
    body: dict[str, Any]
    if module.endswith("routes_anthropic"):
        body = anthropic_error_body(exc)
    elif module.endswith("routes_ollama"):
        body = {"error": exc.message}
    else:
        body = exc.envelope()
    return web.json_response(body, status=exc.status, headers=headers)


def middleware(settings: Settings) -> Middleware:
    max_body = settings.max_body_mib * MIB
    per_client = settings.max_concurrent_per_client
    body_timeout = settings.body_timeout_s
    active: dict[str, int] = {}

    def too_large() -> RequestTooLargeError:
        return RequestTooLargeError(
            f"the request body is over the {settings.max_body_mib} MiB limit; send a smaller body "
            "(or raise max_body_mib in settings.json)"
        )

    @web.middleware
    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > max_body:
            return error_response(request, too_large())  # aiohttp reads the rest away, then closes
        client = str(request.get(CLIENT, "-"))
        counted = per_client > 0 and request.method == "POST"
        if counted:
            running = active.get(client, 0)
            if running >= per_client:
                exc = TooManyRequestsError(
                    f"client {client!r} already has {running} request(s) running, the most allowed "
                    f"(max_concurrent_per_client); retry after one finishes"
                )
                return error_response(request, exc, headers={"Retry-After": str(RETRY_AFTER_S)})
            active[client] = running + 1
        try:
            if request.body_exists:
                try:
                    async with asyncio.timeout(body_timeout):
                        await request.read()  # kept by aiohttp: the handler's read() returns it
                except TimeoutError:
                    exc_t = RequestTimeoutError(
                        f"the request body did not arrive within {body_timeout:g} s (body_timeout_s); "
                        "send the whole body at once"
                    )
                    return await _answer_and_close(request, error_response(request, exc_t))
                except web.HTTPRequestEntityTooLarge:
                    return error_response(request, too_large())
            return await handler(request)
        finally:
            if counted:
                left = active[client] - 1
                if left:
                    active[client] = left
                else:
                    del active[client]

    return limits


async def _answer_and_close(request: web.Request, resp: web.Response) -> web.Response:
    """Send `resp`, then drop the connection: the rest of a trickling body is not waited for (aiohttp
    would otherwise keep reading it for up to 10 s before closing)."""
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    if request.transport is not None:
        request.transport.close()  # after the answer: a transport flushes what it holds before closing
    return resp


# ---- prompt length --------------------------------------------------------------------------------
def slot_context(lane: Lane) -> tuple[int, int, int] | None:
    """(tokens per request, total context, parallel slots) of the lane's running plan."""
    if lane.plan is None or lane.plan.engine != "llama.cpp":
        return None  # counting uses llama.cpp's /tokenize and slot context; other engines check it themselves
    p = lane.plan.params
    if p.ctx_size <= 0 or p.parallel <= 0:
        return None
    return p.ctx_size // p.parallel, p.ctx_size, p.parallel


def may_exceed(body_bytes: int, *, messages: int, slot_ctx: int) -> bool:
    """Whether a request this large could hold `slot_ctx` tokens or more.

    A token covers at least one byte of the body, and the template adds at most TEMPLATE_ALLOWANCE
    tokens plus PER_MESSAGE_ALLOWANCE per message; below that bound the prompt fits without counting."""
    return body_bytes + TEMPLATE_ALLOWANCE + PER_MESSAGE_ALLOWANCE * messages >= slot_ctx


async def check_prompt(
    http: aiohttp.ClientSession, lane: Lane, body: dict[str, Any], *, body_bytes: int, route: str
) -> None:
    """Raise ContextLengthExceededError when the prompt cannot fit one request's context."""
    ctx = slot_context(lane)
    if ctx is None:
        return
    slot, total, parallel = ctx
    try:
        if route == "chat":
            messages = body.get("messages")
            n_msgs = len(messages) if isinstance(messages, list) else 0
            if not may_exceed(body_bytes, messages=n_msgs, slot_ctx=slot):
                return
            n = await count_prompt_tokens(http, lane, body)
            param = "messages"
        else:
            counted = await _completion_tokens(http, lane, body.get("prompt"), body_bytes, slot)
            if counted is None:
                return
            n, param = counted, "prompt"
    except SwitchyardError as exc:  # the engine could not count it: let the engine itself decide
        log.info("could not count the prompt for %s: %s", lane.model_id, exc.message)
        return
    if n >= slot:
        shared = (
            f"{total} tokens shared by {parallel} parallel slots" if parallel > 1 else "its whole context"
        )
        raise ContextLengthExceededError(
            f"the prompt is {n} tokens, but model {lane.model_id!r} has a context of {slot} tokens per "
            f"request ({shared}), and a prompt must leave room for at least one generated token; shorten "
            f"the prompt, or give each request more context: raise ctx_size or lower parallel "
            f"(model_overrides[{lane.model_id!r}] in settings.json)",
            param=param,
        )


async def _completion_tokens(
    http: aiohttp.ClientSession, lane: Lane, prompt: Any, body_bytes: int, slot: int
) -> int | None:
    """The longest prompt of a completion request in tokens (a list of prompts is a batch), or None."""
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return len(prompt)  # token ids: exact, and free
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return max(len(p) for p in prompt)
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return None
    if not may_exceed(body_bytes, messages=0, slot_ctx=slot):
        return None
    longest = 0
    for text in texts:
        if len(text.encode()) + TEMPLATE_ALLOWANCE < slot:
            continue
        tokens = await post_json(http, lane, "/tokenize", {"content": text, "add_special": True})
        if isinstance(tokens, dict) and isinstance(tokens.get("tokens"), list):
            longest = max(longest, len(tokens["tokens"]))
    return longest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
