"""Webhooks: job ends, failed gates, engine crashes, refused requests over a threshold and model updates,
posted to the hooks in settings `notify.webhooks` (docs/jobs.md#notifications).

A hook is {"url", "kind": "json"|"slack", "secret"?, "events"?: [...]}. A "json" hook gets the message as
JSON, signed when it has a secret: `X-Switchyard-Signature: sha256=<hex HMAC-SHA256 of the body>`; a
"slack" hook gets `{"text": ...}`. Each hook has its own queue and sending task, so one slow receiver
delays no other; a message is retried with exponential backoff on a connection error, a 429 or a 5xx,
within a deadline. One (event, subject) goes to a hook at most once an hour, counted from a message queued
for that hook (an event while no hook wanted it uses nothing up; a message never delivered is forgotten).
`test()` posts a test message to each hook at once and reports what each answered.

A hook never reaches this machine (loopback, or an address of its interfaces, where this server may
answer) unless it says `"allow_local": true`: checked when settings load for an IP literal and at connect
time for every address a name resolves to. Every post carries NOTIFICATION_HEADER, and the server refuses
to send notifications for a request that carries it, so a notification never re-enters notification.
Hook URLs (a chat service's carry its token) and secrets are masked wherever they are shown or logged.
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
from aiohttp.abc import AbstractResolver

from app.core.background import cancelled
from app.core.errors import SettingsError
from app.core.events import Event, EventKind
from app.core.netguard import GuardedResolver, is_this_machine, literal_addresses

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
NOTIFICATION_HEADER = "X-Switchyard-Notification"  # on every post: a receiver on this server refuses it
DEDUP_S = 3600.0
DEFAULT_REFUSALS_PER_HOUR = 20
# what the refusal alert counts: a request the safety policy refused (content_policy_violation) or an
# answer it cut (finish_reason content_filter), published by gateway/safety_gate.py; other 4xx answers
# (a 404, a bad body) are the client's mistakes, not refusals
POLICY_REFUSED = EventKind.SAFETY_REFUSED
_HOOK_KEYS = {"url", "kind", "secret", "events", "allow_local"}


@dataclass(frozen=True)
class Hook:
    url: str
    kind: str = "json"
    secret: str | None = field(default=None, repr=False)  # never logged
    events: tuple[str, ...] = ()  # empty: every event
    allow_local: bool = False  # may reach this machine (loopback, its own addresses)

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
        raise SettingsError(
            f'{where} must be {{"url", "kind": "json"|"slack", "secret"?, "events"?, "allow_local"?}}'
        )
    url = hook.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise SettingsError(f"{where}.url must be an http(s) URL, e.g. https://hooks.example.com/x")
    if not isinstance(hook.get("allow_local", False), bool):
        raise SettingsError(f"{where}.allow_local must be true or false")
    if not hook.get("allow_local") and (why := local_target(urlsplit(url).hostname or "")) is not None:
        raise SettingsError(f"{where}.url {why}")
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


def local_target(host: str) -> str | None:
    """Why a hook host given as an IP literal reaches this machine (or is no address), else None."""
    try:
        found = literal_addresses(host)
    except ValueError as exc:
        return f"names {exc}"
    if found and any(is_this_machine(a) for a in found):
        return (
            f"points at this machine ({host}), where it could call this server's own API; a hook may do "
            'that only when it says "allow_local": true'
        )
    return None


def hooks_of(config: dict[str, Any]) -> list[Hook]:
    return [
        Hook(
            h["url"],
            h.get("kind", "json"),
            h.get("secret"),
            tuple(h.get("events", ())),
            bool(h.get("allow_local", False)),
        )
        for h in config.get("webhooks", [])
    ]


def masked_hook_url(url: str) -> str:
    """`https://hooks.slack.com/****`: the path and query of a hook URL may be its token."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    hidden = "/****" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{host}{hidden}"


def public_config(config: dict[str, Any]) -> dict[str, Any]:
    """The `notify` setting as shown (GET /api/settings): hook URLs and secrets masked."""
    hooks = []
    for h in config.get("webhooks", []):
        shown = {**h, "url": masked_hook_url(str(h.get("url", "")))}
        if h.get("secret") is not None:
            shown["secret"] = "****"
        hooks.append(shown)
    return {**config, "webhooks": hooks} if "webhooks" in config else dict(config)


def _refuse_local(host: str, address: str) -> Exception | None:
    if is_this_machine(address):
        return HookRefusedError(
            f'{host} resolves to this machine ({address}); a hook may reach it only with "allow_local": true'
        )
    return None


class HookRefusedError(OSError):
    """A hook whose address is this machine's while it does not allow that."""


def sign(body: bytes, secret: str) -> str:
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body under the secret>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def request_for(hook: Hook, message: Message) -> tuple[bytes, dict[str, str]]:
    """The body and headers one hook gets for one message."""
    doc = {"text": f"Switchyard: {message.text}"} if hook.kind == "slack" else message.public()
    body = json.dumps(doc).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "switchyard-notify",
        NOTIFICATION_HEADER: "1",
    }
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
    """Owned by the server: one queue and sending task per hook, and the hour's de-duplication and
    refusal count."""

    def __init__(
        self,
        *,
        config: Callable[[], dict[str, Any]],
        retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
        deadline_s: float = 60.0,
    ) -> None:
        self.config = config  # read at each send, so a settings change applies at once
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.deadline_s = deadline_s  # one message to one hook, retries included
        self.sent: list[dict[str, Any]] = []  # the last outcomes, for the admin API
        self._lanes: dict[Hook, tuple[asyncio.Queue[Message], asyncio.Task[None]]] = {}
        self._seen: dict[tuple[str, str, str], float] = {}
        self._refusals: list[float] = []
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    async def __aenter__(self) -> Notifier:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        guarded: AbstractResolver = GuardedResolver(_refuse_local)
        self._sessions = {
            False: aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(resolver=guarded)),
            True: aiohttp.ClientSession(timeout=timeout),
        }
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        for _queue, task in self._lanes.values():
            await cancelled(task)
        for session in self._sessions.values():
            await session.close()

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
        """Queue `message` for every hook that wants it and has not had the same (event, subject) this
        hour; False when no hook took it."""
        now = time.monotonic()
        self._seen = {k: t for k, t in self._seen.items() if now - t < DEDUP_S}
        queued = False
        for hook in hooks_of(self.config()):
            key = (hook.url, message.event, message.subject)
            if not hook.wants(message.event) or key in self._seen:
                continue
            with contextlib.suppress(asyncio.QueueFull):  # a flood drops the newest, never blocks
                self._lane(hook).put_nowait(message)
                self._seen[key] = now
                queued = True
        return queued

    def _lane(self, hook: Hook) -> asyncio.Queue[Message]:
        lane = self._lanes.get(hook)
        if lane is None:
            queue: asyncio.Queue[Message] = asyncio.Queue(100)
            task = asyncio.create_task(self._drain(hook, queue), name=f"notify {masked_hook_url(hook.url)}")
            lane = self._lanes[hook] = (queue, task)
        return lane[0]

    async def _drain(self, hook: Hook, queue: asyncio.Queue[Message]) -> None:
        while True:
            message = await queue.get()
            try:
                async with asyncio.timeout(self.deadline_s):
                    outcome = await self._deliver(hook, message)
            except TimeoutError:
                outcome = {
                    "url": hook.url,
                    "kind": hook.kind,
                    "event": message.event,
                    "status": None,
                    "ok": False,
                    "error": f"not delivered within {self.deadline_s:g} s",
                }
            if not outcome.get("ok"):  # never delivered: the hour is not used up
                self._seen.pop((hook.url, message.event, message.subject), None)
                log.warning(
                    "webhook %s: %s not delivered: %s",
                    masked_hook_url(hook.url),
                    message.event,
                    outcome.get("error") or f"HTTP {outcome.get('status')}",
                )
            self.sent = [*self.sent[-49:], outcome]

    async def _deliver(self, hook: Hook, message: Message) -> dict[str, Any]:
        """Post with retries: backoff_s, then twice as long each time, on errors a retry may cure."""
        delay = self.backoff_s
        outcome: dict[str, Any] = {}
        for attempt in range(1, self.retries + 2):
            outcome = await self.post(hook, message)
            outcome["attempts"] = attempt
            status = outcome.get("status")
            if (status is not None and status < 500 and status != 429) or outcome.get("refused"):
                return outcome
            if attempt <= self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        return outcome

    async def post(self, hook: Hook, message: Message) -> dict[str, Any]:
        """One attempt: {url, event, status} or {url, event, status: None, error}."""
        body, headers = request_for(hook, message)
        base: dict[str, Any] = {"url": hook.url, "kind": hook.kind, "event": message.event}
        session = self._sessions.get(hook.allow_local)
        if session is None:
            raise RuntimeError("the notifier is not started")
        if not hook.allow_local and (why := local_target(urlsplit(hook.url).hostname or "")) is not None:
            return {**base, "status": None, "ok": False, "refused": True, "error": f"the hook's url {why}"}
        try:
            async with session.post(hook.url, data=body, headers=headers, allow_redirects=False) as resp:
                return {**base, "status": resp.status, "ok": 200 <= resp.status < 300}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            cause = exc if isinstance(exc, HookRefusedError) else exc.__cause__
            if isinstance(cause, HookRefusedError):
                return {**base, "status": None, "ok": False, "refused": True, "error": str(cause)}
            return {**base, "status": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"}

    async def test(self) -> list[dict[str, Any]]:
        """A test message to every hook now (no queue, no retries, no de-duplication): each one's answer."""
        message = Message("test", "test", "a test message from `switchyard notify test`")
        hooks = hooks_of(self.config())
        return list(await asyncio.gather(*(self.post(h, message) for h in hooks)))
