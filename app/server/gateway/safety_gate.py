"""The safety policy on the request path (docs/safety.md): requests judged before their engine sees them,
answers judged before their client does.

Every surface calls the same three: `check_request` (a refused request is a ContentPolicyError, which
the error middleware writes in the surface's shape: OpenAI 400 `content_policy_violation`, Anthropic 400
`invalid_request_error`, Ollama 400 `{"error"}`); `judged_deltas` for the translated surfaces (held-back
text released a window at a time, cut with Finish("content_filter")); `judged_whole` and
`relay_judged` for the OpenAI pass-through. Each verdict is written to audit.db and counted in /metrics;
each one that blocks is published as a `safety.refused` event (what the notifier's refusal alert counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from app.chat.deltas import Delta, Finish, Text
from app.core.errors import BadRequestError
from app.core.notify import POLICY_REFUSED
from app.core.policy import Policy
from app.lanes.target import Target
from app.safety.audit import AuditLog, AuditRecord
from app.safety.formats import Turn
from app.safety.judge import Failure, Judgement, judge
from app.server.gateway.core import Gateway
from app.server.gateway.judged_text import request_turns, unjudgeable
from app.server.keys import GATEWAY, RUNTIME
from app.server.metrics import METRICS, note_usage
from app.server.request_keys import CLIENT
from app.server.surfaces.base import OPENAI

log = logging.getLogger("switchyard.safety")
_RESETS = (ConnectionResetError, aiohttp.ClientConnectionResetError)


class ContentPolicyError(BadRequestError):
    code = "content_policy_violation"


def audit_log(app: web.Application) -> AuditLog:
    return AuditLog(app[RUNTIME].paths.home / "audit.db")


@dataclass
class Gate:
    """One request under the policy: what it asked, to judge its answer against."""

    request: web.Request
    policy: Policy
    model: str
    turns: list[Turn]
    unreadable: str | None = None  # why the request cannot be judged as text (token ids), else None

    async def verdict(self, stage: str, turns: list[Turn]) -> Judgement:
        judgement = await judge(self.request.app[GATEWAY], self.policy, turns, stage=stage)
        await _record(self, judgement, turns)
        return judgement

    async def answer_blocked(self, text: str) -> bool:
        return (await self.verdict("answer", [*self.turns, Turn("assistant", text)])).blocked


def gate_for(request: web.Request, *, group: str, model: str, body: dict[str, Any]) -> Gate | None:
    """The request's Gate, or None when the policy does not cover it."""
    policy = request.app[GATEWAY].policy()  # parsed once per settings, not per request
    if not policy.applies(group=group, key=request.get(CLIENT), model=model):
        return None
    return Gate(request, policy, model, request_turns(body), unjudgeable(body))


async def check_request(gate: Gate | None) -> None:
    """Refuse the request (ContentPolicyError) when the policy judges requests and its judge says so."""
    if gate is None or not gate.policy.requests:
        return
    if gate.unreadable is not None:  # never judged as empty text: refused when closed, recorded when open
        blocked = gate.policy.fail == "closed"
        failure = Failure("(gateway)", gate.unreadable, 0.0)
        await _record(gate, Judgement("request", None, None, blocked, 0.0, (failure,)), gate.turns)
        if blocked:
            raise ContentPolicyError(
                "the safety policy refuses what it cannot judge (policy.fail is closed), and "
                f"{gate.unreadable}; send the prompt as text",
                param="prompt",
            )
        log.warning("a request to %s passed unjudged (policy.fail is open): %s", gate.model, gate.unreadable)
        return
    judgement = await gate.verdict("request", gate.turns)
    if judgement.verdict is None and not judgement.blocked:
        failed = "; ".join(f"{f.judge}: {f.reason}" for f in judgement.failures)
        log.warning(
            "a request to %s passed unjudged (policy.fail is open): no judge answered (%s)",
            gate.model,
            failed,
        )
    if judgement.blocked:
        raise ContentPolicyError(_refusal(judgement), param="messages")


def answers_judged(gate: Gate | None) -> bool:
    return gate is not None and gate.policy.answers


def _refusal(j: Judgement) -> str:
    if j.verdict is None:
        failed = "; ".join(f"{f.judge}: {f.reason}" for f in j.failures)
        return (
            f"the safety policy refuses requests when no judge answers (policy.fail is closed), and none "
            f"did ({failed}); check the judges with `switchyard guard status`"
        )
    cats = ", ".join(j.verdict.categories) or "no category given"
    return (
        f"the safety policy refused this request: judge {j.judge!r} found it {j.verdict.level} ({cats}); "
        "rephrase it, or ask this server's owner about its policy (docs/safety.md)"
    )


async def _record(gate: Gate, j: Judgement, turns: list[Turn]) -> None:
    key = gate.request.get(CLIENT)
    text = None
    if gate.policy.audit_text and turns:  # what the judge read: a long text's start and end around [...]
        text = j.read if j.read is not None else turns[-1].text
    rows = [
        AuditRecord(
            model=gate.model,
            stage=j.stage,
            verdict="error",
            judge=f.judge,
            key_name=key,
            latency_ms=f.seconds * 1000,
            blocked=j.verdict is None and j.blocked,
            reason=f.reason,
            text=text,
        )
        for f in j.failures
    ]
    if j.verdict is not None:
        rows.append(
            AuditRecord(
                model=gate.model,
                stage=j.stage,
                verdict=j.verdict.level,
                judge=j.judge,
                key_name=key,
                categories=j.verdict.categories,
                latency_ms=j.seconds * 1000,
                blocked=j.blocked,
                text=text,
            )
        )
    gate.request.app[METRICS].count_verdict(
        stage=j.stage,
        judge=j.judge or "-",
        verdict=j.label,
        blocked=j.blocked,
        failed=[f.judge for f in j.failures],
    )
    if j.blocked:
        gate.request.app[RUNTIME].bus.publish(
            POLICY_REFUSED,
            stage=j.stage,
            model=gate.model,
            judge=j.judge,
            verdict=j.label,
            categories=list(j.verdict.categories) if j.verdict is not None else [],
            client=key,
        )
    try:
        await asyncio.to_thread(audit_log(gate.request.app).add, *rows)
    except Exception as exc:  # an audit that cannot be written must not take the answer down
        log.warning("could not write the safety audit (%s): %s", type(exc).__name__, exc)


# ---- translated surfaces (gateway/runner.py) ---------------------------------------------------------
async def judged_deltas(gate: Gate, deltas: AsyncIterator[Delta]) -> AsyncGenerator[Delta, None]:
    """`deltas` with their text held back until the answer so far is judged (every stream_window
    characters, and at its end); an answer judged to block ends in Finish("content_filter")."""
    answer: list[str] = []
    pending: list[Delta] = []
    since = 0
    async for delta in deltas:
        pending.append(delta)
        if isinstance(delta, Text):
            answer.append(delta.text)
            since += len(delta.text)
        if since >= gate.policy.stream_window:
            if await gate.answer_blocked("".join(answer)):
                yield Finish("content_filter")
                return
            for held in pending:
                yield held
            pending, since = [], 0
    if any(isinstance(d, Text) for d in pending) and await gate.answer_blocked("".join(answer)):
        yield Finish("content_filter")
        return
    for held in pending:
        yield held


# ---- the OpenAI pass-through (gateway/proxy.py) ------------------------------------------------------
async def judged_whole(gate: Gate, data: bytes) -> bytes:
    """A whole chat or completion answer, its text emptied and finish_reason "content_filter" when the
    policy blocks it."""
    try:
        answer = json.loads(data)
        choice = answer["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return data  # not an answer (an engine's error body): nothing to judge
    message = choice.get("message") if isinstance(choice.get("message"), dict) else None
    text = str(message.get("content") or "") if message is not None else str(choice.get("text") or "")
    if not text or not await gate.answer_blocked(text):
        return data
    if message is not None:
        message["content"] = ""
        message.pop("tool_calls", None)
    else:
        choice["text"] = ""
    choice["finish_reason"] = "content_filter"
    return json.dumps(answer).encode()


async def relay_judged(
    request: web.Request,
    gate: Gate,
    gw: Gateway,
    target: Target,
    path: str,
    body: dict[str, Any],
    resp: web.StreamResponse | None,
) -> web.StreamResponse:
    """An OpenAI stream relayed event by event, each window of text released once judged; a blocked
    answer ends with a chunk whose finish_reason is "content_filter", then [DONE]."""
    upstream = await gw.post(target, path, body, stream=True)
    try:
        if resp is None:
            resp = OPENAI.stream_response()
            await resp.prepare(request)
        await _pump_judged(gate, upstream, resp, target)
        await resp.write_eof()
    except _RESETS:
        log.info("client went away mid-stream; closing the upstream request")
    finally:
        upstream.close()  # closing drops the socket: the engine stops generating
    assert resp is not None
    return resp


async def _pump_judged(
    gate: Gate, upstream: aiohttp.ClientResponse, resp: web.StreamResponse, target: Target
) -> None:
    buf = b""
    answer: list[str] = []
    pending: list[bytes] = []
    since = 0
    last: dict[str, Any] = {}
    while piece := await target.bounded(upstream.content.readany()):
        buf += piece
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.removeprefix(b"data:").strip()
            if data == b"[DONE]":
                await _release(gate, answer, pending, resp, last, since, final=True)
                await resp.write(b"data: [DONE]\n\n")
                return
            pending.append(event + b"\n\n")
            chunk = _json(data)
            if chunk is not None:
                last = chunk
                added = _chunk_text(chunk)
                answer.append(added)
                since += len(added)
            if since >= gate.policy.stream_window:
                if not await _release(gate, answer, pending, resp, last, since, final=False):
                    return
                since = 0
    await _release(gate, answer, pending, resp, last, since, final=True)


async def _release(
    gate: Gate,
    answer: list[str],
    pending: list[bytes],
    resp: web.StreamResponse,
    last: dict[str, Any],
    since: int,
    *,
    final: bool,
) -> bool:
    """Judge the answer so far and write the held events (True), or write the cut (False)."""
    if since > 0 and await gate.answer_blocked("".join(answer)):
        pending.clear()
        cut = {**{k: last.get(k) for k in ("id", "object", "created", "model")}}
        kind = "delta" if last.get("object") == "chat.completion.chunk" else "text"
        cut["choices"] = [
            {"index": 0, kind: {} if kind == "delta" else "", "finish_reason": "content_filter"}
        ]
        await resp.write(f"data: {json.dumps(cut)}\n\n".encode())
        if not final:
            await resp.write(b"data: [DONE]\n\n")
        return False
    for event in pending:
        await resp.write(event)
    pending.clear()
    return True


def _json(data: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        value = json.loads(data)
        return value if isinstance(value, dict) else None
    return None


def _chunk_text(chunk: dict[str, Any]) -> str:
    try:
        choice = chunk["choices"][0]
    except (KeyError, IndexError, TypeError):
        return ""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


async def judged_answer(
    request: web.Request,
    gate: Gate,
    gw: Gateway,
    target: Target,
    path: str,
    body: dict[str, Any],
    resp: web.StreamResponse | None,
    *,
    route: str,
) -> web.StreamResponse:
    """The OpenAI pass-through's answer under a policy that judges answers: a stream in judged windows
    (relay_judged), a whole answer judged before it is sent."""
    if body.get("stream") is True:
        return await relay_judged(request, gate, gw, target, path, body, resp)
    if gw.answers_whole(target, route, body):
        data = await gw.whole(target, path, body, route=route)
    else:
        data = await gw.read(target, await gw.post(target, path, body))
    data = await judged_whole(gate, data)
    note_usage(request, data)
    if resp is not None:  # the headers went out with the loading comments
        await resp.write(b"data: " + data + b"\n\n")
        return resp
    return web.Response(body=data, content_type="application/json")


# the request's Gate on the translated surfaces, where the runner reads the engine's deltas
GATE: web.RequestKey[Gate] = web.RequestKey("safety_gate", Gate)


def judging(request: web.Request, deltas: AsyncGenerator[Delta, None]) -> AsyncGenerator[Delta, None]:
    """`deltas` judged in windows when the request's policy judges answers, else as they are."""
    gate = request.get(GATE)
    return judged_deltas(gate, deltas) if gate is not None and answers_judged(gate) else deltas
