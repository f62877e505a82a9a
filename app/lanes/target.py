"""What a request goes to: a local lane (`Lane`) or one model of a remote (`RemoteLane`).

The gateway (app/server/gateway.py) knows targets only through this protocol, so a new lane kind needs no
change in `server/`: the target says where it listens, which headers it needs, what the request's model is
called there, how a refusal or a broken connection reads as an error, and which checks the gateway must make
for it before sending (a local llama.cpp engine has a per-request context and may lack a vision projector; a
remote checks for itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Iterator
from typing import Protocol, TypeVar, runtime_checkable

import aiohttp

from app.core.errors import SwitchyardError, UpstreamRefusedError

T = TypeVar("T")


class Requests:
    """One target's requests: how many are in flight, when one last began or ended (time.time()), and
    `idle`, set while none runs (a drain awaits it). Lanes and remote lanes both count through it."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_used: float | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Count one request as in flight for the block, refreshing last_used as it begins and ends."""
        self.in_flight += 1
        self.idle.clear()
        self.last_used = time.time()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_used = time.time()
            if self.in_flight == 0:
                self.idle.set()


class Progress:
    """When a byte last came from the engine on any of its requests (time.monotonic()). A plain attribute:
    the byte relay sets it from its socket callback, once per read."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = time.monotonic()


@runtime_checkable
class Target(Protocol):
    id: str
    model_id: str
    engine: str

    @property
    def in_flight(self) -> int: ...

    @property
    def last_used(self) -> float | None: ...

    @property
    def available(self) -> bool: ...

    @property
    def base_url(self) -> str: ...

    @property
    def served_name(self) -> str: ...

    @property
    def progress(self) -> Progress | None:
        """Where the byte relay marks the engine's progress (a local engine's), or None."""
        ...

    def auth_headers(self) -> dict[str, str]: ...

    async def bounded(self, aw: Awaitable[T]) -> T:
        """`aw`'s result, bounded as this target needs: a local engine by its read timeout (504
        engine_unresponsive, the lane restarted), a remote by its own connection's timeouts."""
        ...

    def broken(self, exc: BaseException | None = None) -> SwitchyardError:
        """The error for a request whose connection broke (`exc`: how)."""
        ...

    def refused(self, status: int, data: bytes) -> SwitchyardError:
        """The upstream's error answer (`status`, its body) as our error, naming who refused."""
        ...

    def slot_context(self) -> tuple[int, int, int] | None:
        """(tokens per request, total context, parallel slots) when the gateway must check prompt length
        itself; None when the engine checks for itself."""
        ...

    async def sees_images(self, http: aiohttp.ClientSession) -> bool | None:
        """Whether the engine can read images: True/False for a local engine, None for one that decides for
        itself (a remote)."""
        ...


def refusal_error(status: int, data: bytes, *, who: str, source: str) -> UpstreamRefusedError:
    """An upstream error answer (`{"error": {...}}`, `{"error": "..."}` or plain text) as our error: its
    status, message, type and code kept, the message opened by `who` ("the engine for 'tiny'")."""
    message = data.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    etype: object = None
    code: object = None
    param: object = None
    try:
        err = json.loads(data).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            etype, code, param = err.get("type"), err.get("code"), err.get("param")
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    return UpstreamRefusedError(
        f"{who} refused the request: {message}",
        status=status,
        source=source,
        etype=etype if isinstance(etype, str) else None,
        code=code if isinstance(code, str) else None,
        param=param if isinstance(param, str) else None,
    )
