"""Webhooks: job ends, failed gates, engine crashes, refused requests over a threshold and model updates,
posted to the hooks in settings `notify.webhooks` (docs/jobs.md#notifications).

A hook is {"url", "kind": "json"|"slack", "secret"?, "events"?: [...]}. A "json" hook gets the message as
JSON, signed when it has a secret: `X-Switchyard-Signature: sha256=<hex HMAC-SHA256 of the body>`; a
"slack" hook gets `{"text": ...}`. Messages wait in a queue and are posted by one task, each retried with
exponential backoff on a connection error, a 429 or a 5xx; one (event, subject) is sent at most once an
hour. `test()` posts a test message to each hook at once and reports what each answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from app.core.background import cancelled
from app.core.errors import SettingsError
from app.core.events import Event

log = logging.getLogger(__name__)
EVENTS = (
    "job.completed",
    "job.failed",
    "job.cancelled",
    "gate.failed",
    "lane.failed",
    "requests.refused",
    "model.update_available",
)
SIGNATURE_HEADER = "X-Switchyard-Signature"
DEDUP_S = 3600.0
DEFAULT_REFUSALS_PER_HOUR = 20
# what the refusal alert counts: a request the safety policy refused (content_policy_violation) or an
# answer it cut (finish_reason content_filter), published by app/server/safety_gate.py; other 4xx answers
# (a 404, a bad body) are the client's mistakes, not refusals
POLICY_REFUSED = "safety.refused"
_HOOK_KEYS = {"url", "kind", "secret", "events"}


@dataclass(frozen=True)
class Hook:
    url: str
    kind: str = "json"
    secret: str | None = field(default=None, repr=False)  # never logged
    events: tuple[str, ...] = ()  # empty: every event

    def wants(self, event: str) -> bool:
        return event == "test" or not self.events or event in self.events


@dataclass(frozen=True)
class Message:
    event: str
    subject: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)

    def public(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "subject": self.subject,
            "text": self.text,
            "ts": self.ts,
            "data": self.data,
        }


def _check_hook(i: int, hook: Any, origin: str) -> None:
    where = f"{origin}: notify.webhooks[{i}]"
    if not isinstance(hook, dict) or set(hook) - _HOOK_KEYS:
        raise SettingsError(f'{where} must be {{"url", "kind": "json"|"slack", "secret"?, "events"?}}')
    url = hook.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise SettingsError(f"{where}.url must be an http(s) URL, e.g. https://hooks.example.com/x")
    if hook.get("kind", "json") not in ("json", "slack"):
        raise SettingsError(f'{where}.kind must be "json" or "slack"')
    if hook.get("secret") is not None and not isinstance(hook["secret"], str):
        raise SettingsError(f"{where}.secret must be a string")
    events = hook.get("events", [])
    if not isinstance(events, list) or any(e not in EVENTS for e in events):
        raise SettingsError(f"{where}.events must be a list of: {', '.join(EVENTS)} (empty: all)")


def check_config(value: Any, origin: str) -> dict[str, Any]:
    """The `notify` setting, checked: {"webhooks": [hook...], "refusals_per_hour": N}."""
    if not isinstance(value, dict) or set(value) - {"webhooks", "refusals_per_hour"}:
        raise SettingsError(f'{origin}: notify must be {{"webhooks": [...], "refusals_per_hour": N}}')
    hooks = value.get("webhooks", [])
    if not isinstance(hooks, list):
        raise SettingsError(f"{origin}: notify.webhooks must be a list of hooks")
    for i, hook in enumerate(hooks):
        _check_hook(i, hook, origin)
    limit = value.get("refusals_per_hour", DEFAULT_REFUSALS_PER_HOUR)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SettingsError(f"{origin}: notify.refusals_per_hour must be a whole number, 1 or more")
    return value


def hooks_of(config: dict[str, Any]) -> list[Hook]:
    return [
        Hook(h["url"], h.get("kind", "json"), h.get("secret"), tuple(h.get("events", ())))
        for h in config.get("webhooks", [])
    ]


def sign(body: bytes, secret: str) -> str:
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body under the secret>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def request_for(hook: Hook, message: Message) -> tuple[bytes, dict[str, str]]:
    """The body and headers one hook gets for one message."""
    doc = {"text": f"Switchyard: {message.text}"} if hook.kind == "slack" else message.public()
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "switchyard-notify"}
    if hook.kind == "json" and hook.secret:
        headers[SIGNATURE_HEADER] = sign(body, hook.secret)
    return body, headers


def message_for(ev: Event) -> Message | None:
    """The notification an event on the bus is worth, if any (the refusal count is the Notifier's)."""
    d = ev.data
    if ev.kind in ("job.completed", "job.failed", "job.cancelled"):
        result = d.get("result") or {}
        if d.get("job_kind") == "update" and result.get("status") == "kept":
            text = f"{d.get('title')}: the new revision failed its gate ({result.get('score')} < "
            return Message("gate.failed", str(d.get("subject")), text + f"{result.get('min_score')})", d)
        state = ev.kind.removeprefix("job.")
        error = f": {d['error']}" if d.get("error") else ""
        return Message(ev.kind, str(d.get("id")), f"{d.get('title')} {state}{error}", d)
    if ev.kind == "lane.state" and d.get("state") == "failed":
        return Message(
            "lane.failed", str(d.get("model")), f"the engine of {d.get('model')} failed: {d.get('reason')}", d
        )
    if ev.kind == "model.update_available":
        text = f"{d.get('model')} has an update on the hub ({str(d.get('head'))[:12]})"
        return Message(ev.kind, f"{d.get('model')}@{d.get('head')}", text, d)
    return None


def tray_message(kind: str, data: dict[str, Any]) -> tuple[str, str, bool] | None:
    """(title, text, warn) for the desktop tray: a job's end and a model's update, else None."""
    if kind in ("job.completed", "job.failed", "job.cancelled"):
        state = kind.removeprefix("job.")
        error = f": {data['error']}" if data.get("error") else ""
        return f"Job {state}", f"{data.get('title')}{error}", kind == "job.failed"
    if kind == "model.update_available":
        return "Update available", f"{data.get('model')}: a newer revision is on the hub", False
    return None


class Notifier:
    """Owned by the server: the queue, its sending task and the hour's de-duplication and refusal count."""

    def __init__(
        self,
        *,
        config: Callable[[], dict[str, Any]],
        retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.config = config  # read at each send, so a settings change applies at once
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.sent: list[dict[str, Any]] = []  # the last outcomes, for the admin API
        self._queue: asyncio.Queue[tuple[Hook, Message]] = asyncio.Queue(1000)
        self._seen: dict[tuple[str, str], float] = {}
        self._refusals: list[float] = []
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Notifier:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self._task = asyncio.create_task(self._drain(), name="notify")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await cancelled(self._task)
        if self._session is not None:
            await self._session.close()

    def observe(self, ev: Event) -> None:
        if ev.kind == POLICY_REFUSED:
            self._count_refusal()
            return
        message = message_for(ev)
        if message is not None:
            self.notify(message)

    def _count_refusal(self) -> None:
        now = time.monotonic()
        self._refusals = [t for t in self._refusals if now - t < DEDUP_S] + [now]
        limit = int(self.config().get("refusals_per_hour", DEFAULT_REFUSALS_PER_HOUR))
        if len(self._refusals) >= limit:
            text = f"{len(self._refusals)} requests refused in the last hour (the limit is {limit})"
            self.notify(Message("requests.refused", "server", text, {"count": len(self._refusals)}))

    def notify(self, message: Message) -> bool:
        """Queue `message` for every hook that wants it; False when the same one went out this hour."""
        key, now = (message.event, message.subject), time.monotonic()
        if now - self._seen.get(key, -DEDUP_S) < DEDUP_S:
            return False
        self._seen = {k: t for k, t in self._seen.items() if now - t < DEDUP_S}
        self._seen[key] = now
        for hook in hooks_of(self.config()):
            if hook.wants(message.event):
                with contextlib.suppress(asyncio.QueueFull):  # a flood drops the newest, never blocks
                    self._queue.put_nowait((hook, message))
        return True

    async def _drain(self) -> None:
        while True:
            hook, message = await self._queue.get()
            outcome = await self._deliver(hook, message)
            self.sent = [*self.sent[-49:], outcome]

    async def _deliver(self, hook: Hook, message: Message) -> dict[str, Any]:
        """Post with retries: backoff_s, then twice as long each time, on errors a retry may cure."""
        delay = self.backoff_s
        outcome: dict[str, Any] = {}
        for attempt in range(1, self.retries + 2):
            outcome = await self.post(hook, message)
            outcome["attempts"] = attempt
            status = outcome.get("status")
            if status is not None and status < 500 and status != 429:
                return outcome
            if attempt <= self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        log.warning("webhook %s gave up after %d tries: %s", hook.url, self.retries + 1, outcome.get("error"))
        return outcome

    async def post(self, hook: Hook, message: Message) -> dict[str, Any]:
        """One attempt: {url, event, status} or {url, event, status: None, error}."""
        body, headers = request_for(hook, message)
        base: dict[str, Any] = {"url": hook.url, "kind": hook.kind, "event": message.event}
        session = self._session
        if session is None:
            raise RuntimeError("the notifier is not started")
        try:
            async with session.post(hook.url, data=body, headers=headers) as resp:
                return {**base, "status": resp.status, "ok": 200 <= resp.status < 300}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return {**base, "status": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"}

    async def test(self) -> list[dict[str, Any]]:
        """A test message to every hook now (no queue, no retries, no de-duplication): each one's answer."""
        message = Message("test", "test", "a test message from `switchyard notify test`")
        hooks = hooks_of(self.config())
        return list(await asyncio.gather(*(self.post(h, message) for h in hooks)))
