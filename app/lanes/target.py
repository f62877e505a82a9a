"""What a request goes to: a local lane (`Lane`) or one model of a remote (`RemoteLane`).

The gateway (app/server/gateway/core.py) knows targets only through this protocol, so a new lane kind needs no
change in `server/`: the target says where it listens, which headers it needs, what the request's model is
called there, how a refusal or a broken connection reads as an error, and which checks the gateway must make
for it before sending (a local llama.cpp engine has a per-request context and may lack a vision projector; a
remote checks for itself), and what the gateway would otherwise learn by testing its class: the session its
requests go through, whether a trace goes on, whether its streams may take the byte relay, how a prompt is
counted, and what it fills in on a request (a llama.cpp lane's output cap and adapter scales).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

import aiohttp

from app.core.errors import SwitchyardError, UpstreamRefusedError
from app.core.settings import Settings

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


class Counted:
    """What a target with a `Requests` of its own (`_requests`) answers about its requests."""

    _requests: Requests

    @property
    def in_flight(self) -> int:
        """Requests holding the target now (counted by `request()` only)."""
        return self._requests.in_flight

    @property
    def last_used(self) -> float | None:
        """When (time.time()) a request last began or ended here (a lane also marks its engine ready)."""
        return self._requests.last_used

    def request(self) -> contextlib.AbstractContextManager[None]:
        """Count one request as in flight for the block, refreshing last_used as it begins and ends."""
        return self._requests.hold()


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

    # ---- what the gateway asks instead of which class a target is -----------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        """The client session its requests go through (local engines share one; remotes have their own)."""
        ...

    @property
    def traced(self) -> bool:
        """Whether the client's trace context goes on with the request (a remote continues it)."""
        ...

    @property
    def relays_raw(self) -> bool:
        """Whether its streams may be relayed at the protocol level (a local engine on plain HTTP); False
        where aiohttp must carry them (TLS, proxies, pooled connections to another host)."""
        ...

    @property
    def tokenizes(self) -> bool:
        """Whether prompts are counted by the engine's own /apply-template and /tokenize; False: by asking
        for one token of answer and reading the usage it reports."""
        ...

    def garbled(self, path: str) -> SwitchyardError:
        """The error for an answer to `path` that is not the JSON the API promises."""
        ...

    def request_defaults(
        self, body: dict[str, Any], *, route: str, settings: Settings
    ) -> dict[str, Any] | None:
        """`body` with what this target fills in that the client left open (an output cap, an adapter's
        scales), or None to send it as it is."""
        ...

    def draft_unsuited(self, body: dict[str, Any], *, settings: Settings) -> str | None:
        """Why this target's draft model does not pay on `body`, or None (it does, or there is none)."""
        ...

    def logprobs_partial(self, body: dict[str, Any]) -> str | None:
        """Why `body`'s log probabilities would cover only some tokens here (speculation), or None."""
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
    if status >= 500 and OUTPUT_PARSE_FAILURE.search(message):
        return output_unparsed_error(message, who=who, source=source)
    return UpstreamRefusedError(
        f"{who} refused the request: {message}",
        status=status,
        source=source,
        etype=etype if isinstance(etype, str) else None,
        code=code if isinstance(code, str) else None,
        param=param if isinstance(param, str) else None,
    )


# llama.cpp's chat-output parser rejecting what the model wrote: "The model produced output that does not
# match the expected peg-native format" (and the same for its other formats)
OUTPUT_PARSE_FAILURE = re.compile(r"does not match the expected [\w-]+ format")


def output_unparsed_error(message: str, *, who: str, source: str) -> UpstreamRefusedError:
    """The engine generated an answer and then could not parse it with its own chat-format parser: the
    grammar (a JSON schema, tools) let the model write text that the parser rejects. Not the client's
    fault nor the gateway's: a 502 that says so and what to try."""
    return UpstreamRefusedError(
        f"{who} generated an answer that its own output parser then rejected ({message}). The grammar "
        "from the request's JSON schema or tools allowed text the engine's parser does not accept (seen "
        "with free-text strings from models that write raw bytes); retry with another seed or a lower "
        "temperature, or ask without response_format and check the JSON yourself",
        status=502,
        source=source,
        etype="engine_error",
        code="engine_output_unparsed",
    )
