"""A remote: an OpenAI-compatible endpoint on another machine, served through the gateway like a local lane.

Another Switchyard, or a vLLM/SGLang deployment spread over several nodes by their own launchers: Switchyard
starts nothing there, it checks the endpoint's health (GET {url}/models with the remote's key) and passes
requests through. Each remote model is exposed as `NAME/MODEL`; a `RemoteLane` is the per-model object the
gateway holds for one request: `base_url`, `available`, the key header, the capability answer and the error
for a broken request, the same surface a local `Lane` offers.

States: checking (not checked yet), ready, unreachable, unauthorized (the remote refused the key, or needs
one and none is kept). Every change is published once as a `remote.state` event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable
from enum import StrEnum
from typing import Any, TypeVar

import aiohttp

from app.core.errors import (
    CapabilityMissingError,
    RemoteAuthError,
    RemoteFailedError,
    RemoteUnavailableError,
    SwitchyardError,
)
from app.core.events import EventBus, EventKind
from app.core.secrets import Secret
from app.core.settings import Settings
from app.hub.safe_names import control_problem
from app.lanes.lane import Lane
from app.lanes.remote.store import RemoteSpec, SeenModel, key_env_name
from app.lanes.target import Counted, Requests, refusal_error

T = TypeVar("T")

CHECK_TIMEOUT_S = 5.0
# the header GET /v1/models carries this server's instance id in: a remote answering with ours is us
INSTANCE_HEADER = "X-Switchyard-Instance"
# What a model of each kind can do; a remote that says no kind (vLLM, SGLang) is asked anything, and
# answers for itself.
_KIND_CAPS = {
    "chat": frozenset({"chat", "completions", "tools"}),
    "embedding": frozenset({"embeddings"}),
    "rerank": frozenset({"rerank"}),
    "speech": frozenset({"speech"}),
    "image": frozenset({"images"}),
    "transcription": frozenset({"transcription", "translation"}),
}
_ANY = frozenset(cap for caps in _KIND_CAPS.values() for cap in caps)
# a remote's model list is shown in terminals, logs and remotes.json: bounded, and only printable ids
MAX_LISTED = 1024
MAX_ID_CHARS = 256
_KIND = re.compile(r"[a-z][a-z_-]{0,31}")


def listed_models(data: list[Any]) -> tuple[tuple[SeenModel, ...], int]:
    """The models of a remote's GET /models answer that can be exposed, and how many were left out: an
    id that is not a string, is empty or longer than MAX_ID_CHARS, has surrounding spaces or a control
    character (it would forge log lines or move a terminal's cursor), and anything past MAX_LISTED. A
    kind that is not a short lowercase word is dropped (the model stays, asked anything)."""
    seen: list[SeenModel] = []
    refused = 0
    for m in data:
        if isinstance(m, dict) and isinstance(m.get("remote"), str):
            continue  # a remote of that server's own: never listed here (a loop would nest NAME/ ids)
        model_id = m.get("id") if isinstance(m, dict) else None
        ok = (
            isinstance(model_id, str)
            and 0 < len(model_id) <= MAX_ID_CHARS
            and model_id == model_id.strip()
            and control_problem(model_id) is None
        )
        if not ok or len(seen) >= MAX_LISTED:
            refused += 1
            continue
        kind = m.get("kind")
        known = isinstance(kind, str) and _KIND.fullmatch(kind) is not None
        seen.append(SeenModel(str(model_id), kind if known else None))
    return tuple(seen), refused


class RemoteState(StrEnum):
    CHECKING = "checking"
    READY = "ready"
    UNREACHABLE = "unreachable"
    UNAUTHORIZED = "unauthorized"


class Remote:
    """One registered remote: its spec, its key (looked up at each check), its state and its models."""

    def __init__(
        self,
        spec: RemoteSpec,
        *,
        bus: EventBus,
        key: tuple[Secret | None, str | None],
        http: aiohttp.ClientSession | None = None,
    ) -> None:
        self.spec = spec
        self.bus = bus
        self.http = http  # the registry's session, which its requests go through (None outside a server)
        self.key, self.key_source = key
        self.state = RemoteState.CHECKING
        self.error: str | None = None
        self.checked_at: float | None = None
        # the last list, kept across restarts (filtered again: it may predate the filter)
        self.seen: tuple[SeenModel, ...] = listed_models([{"id": m.id, "kind": m.kind} for m in spec.seen])[0]
        self.refused = 0  # models the last list named that were left out (see listed_models)
        self._lanes: dict[str, RemoteLane] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base(self) -> str:
        """The URL the gateway's `/v1/...` paths are appended to (the API root without its /v1)."""
        return self.spec.url[: -len("/v1")]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key.reveal()}"} if self.key is not None else {}

    def models(self) -> list[SeenModel]:
        """The models exposed as NAME/MODEL: the allow-list when there is one, else what it listed."""
        if not self.spec.models:
            return list(self.seen)
        kinds = {m.id: m.kind for m in self.seen}
        return [SeenModel(m, kinds.get(m)) for m in self.spec.models]

    def lane(self, model: str) -> RemoteLane:
        lane = self._lanes.get(model)
        if lane is None:
            lane = self._lanes[model] = RemoteLane(self, model)
        return lane

    def in_flight(self) -> int:
        return sum(ln.in_flight for ln in self._lanes.values())

    # ---- health ----------------------------------------------------------------------------------------
    def _set(self, state: RemoteState, error: str | None) -> None:
        self.error = error
        if state is self.state:
            return
        previous, self.state = self.state, state
        self.bus.publish(
            EventKind.REMOTE_STATE,
            remote=self.name,
            state=str(state),
            previous=str(previous),
            error=error,
            models=len(self.models()),
        )

    # what an unreachable one is called, what to check (a peer: `serve --tls`), the command that asks again
    noun, runs, check_command = "remote", "it runs", "switchyard remote check"

    def unreachable(self, detail: str) -> RemoteUnavailableError:
        self._set(
            RemoteState.UNREACHABLE,
            f"{self.noun} {self.name!r} at {self.spec.url} does not answer ({detail}); check that "
            f"{self.runs} and is reachable from here, then `{self.check_command} {self.name}`",
        )
        assert self.error is not None
        return RemoteUnavailableError(self.error)

    def unreachable_self(self) -> None:
        self._set(
            RemoteState.UNREACHABLE,
            f"remote {self.name!r} at {self.spec.url} is this server itself (its model list answered with "
            f"this server's own instance id); remove it: `switchyard remote rm {self.name}`",
        )

    @property
    def is_self(self) -> bool:
        return self.error is not None and "is this server itself" in self.error

    def _auth_message(self, status: int) -> str:
        if self.key is None:
            lost = (
                " (it was kept in memory by the server it was given to, which has stopped since)"
                if self.spec.key_kept == "session"
                else ""
            )
            return (
                f"remote {self.name!r} needs an API key (HTTP {status}) and none is kept for it{lost}; "
                f"`switchyard remote rm {self.name}` and add it again with --api-key-stdin, or set "
                f"{key_env_name(self.name)} in the server's environment"
            )
        return (
            f"remote {self.name!r} refused the API key kept for it (from the {self.key_source}) with HTTP "
            f"{status}; `switchyard remote rm {self.name}` and add it again with the right key "
            f"(--api-key-stdin), or set {key_env_name(self.name)}"
        )

    def auth_failed(self, status: int) -> RemoteAuthError:
        self._set(RemoteState.UNAUTHORIZED, self._auth_message(status))
        assert self.error is not None
        return RemoteAuthError(self.error)

    async def check(
        self, http: aiohttp.ClientSession, *, key: tuple[Secret | None, str | None], own: str | None = None
    ) -> bool:
        """GET {url}/models now; True when the list changed. Never raises: the state says what happened.
        `own`: this server's instance id; a remote that answers with it is this server itself (refused)."""
        self.key, self.key_source = key
        self.checked_at = time.time()
        try:
            async with http.get(
                self.spec.url + "/models",
                headers=self.headers(),
                timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
            ) as r:
                if r.status in (401, 403):
                    self.auth_failed(r.status)
                    return False
                if r.status != 200:
                    self.unreachable(f"GET {self.spec.url}/models answered HTTP {r.status}")
                    return False
                if own is not None and r.headers.get(INSTANCE_HEADER) == own:
                    self.seen = ()
                    self.unreachable_self()
                    return True
                doc = await r.json(content_type=None)
        except TimeoutError:
            self.unreachable(f"no answer within {CHECK_TIMEOUT_S:g} s")
            return False
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            self.unreachable(describe(exc))
            return False
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            self.unreachable(f"GET {self.spec.url}/models did not answer with an OpenAI model list")
            return False
        seen, self.refused = listed_models(data)
        changed = seen != self.seen
        self.seen = seen
        self._set(RemoteState.READY, None)
        return changed

    def public(self) -> dict[str, Any]:
        listed = {m.id for m in self.seen}
        return {
            "name": self.name,
            "url": self.spec.url,
            "state": str(self.state),
            "error": self.error,
            "checked_at": self.checked_at,
            "key": {"set": self.key is not None, "source": self.key_source, "kept": self.spec.key_kept},
            "allow_list": list(self.spec.models),
            "models": [
                {"id": f"{self.name}/{m.id}", "remote_id": m.id, "kind": m.kind, "listed": m.id in listed}
                for m in self.models()
            ],
            "refused_models": self.refused,
            "in_flight": self.in_flight(),
        }


def describe(exc: BaseException) -> str:
    """A connection failure in a few words ("cannot connect to host:port: Connection refused")."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        return f"cannot connect to {exc.host}:{exc.port}: {os_error.strerror or os_error}"
    return (str(exc) or type(exc).__name__)[:300]


class RemoteLane(Counted):
    """One remote model, as the gateway holds it for a request (the interface of a local Lane)."""

    engine = "remote"
    proc = None  # no process of ours: nothing to watch, nothing to restart
    progress = None  # the remote's own timeouts bound its answers (see `bounded`)
    plan = None  # no launch plan: the gateway's prompt-length check (llama.cpp's) leaves it to the remote

    def __init__(self, remote: Remote, upstream: str) -> None:
        self.remote = remote
        self.served_name = upstream  # the name the remote knows it by
        self.id = self.model_id = f"{remote.name}/{upstream}"
        self._requests = Requests()

    @property
    def available(self) -> bool:
        return self.remote.state is RemoteState.READY

    async def bounded(self, aw: Awaitable[T]) -> T:
        return await aw  # a remote answers for itself: its connection has its own timeouts

    @property
    def base_url(self) -> str:
        return self.remote.base

    @property
    def kind(self) -> str | None:
        return next((m.kind for m in self.remote.seen if m.id == self.served_name), None)

    @property
    def listed(self) -> bool:
        """Whether the remote listed this model at its last check (or the allow-list names it)."""
        return any(m.id == self.served_name for m in self.remote.models())

    def auth_headers(self) -> dict[str, str]:
        """The remote's key: replaces whatever the local client sent (never forwarded)."""
        return self.remote.headers()

    def broken(self, exc: BaseException | None = None) -> SwitchyardError:
        """A remote that cannot be reached at all is a 503 (nothing was sent); a request cut off after it
        was sent is a 502."""
        if isinstance(exc, aiohttp.ClientConnectorError):
            return self.remote.unreachable(describe(exc))
        return RemoteFailedError(
            f"remote {self.remote.name!r} broke off the request for {self.model_id!r} (the connection to "
            f"{self.remote.spec.url} was lost); retry, and if it persists `switchyard remote check "
            f"{self.remote.name}`"
        )

    def refused(self, status: int, data: bytes) -> SwitchyardError:
        """The remote's error answer: our key refused -> a 502 `remote_auth_failed` (the client's own key
        was fine, and the remote is marked so); anything else with its status, message, type and code."""
        if status in (401, 403):
            return self.remote.auth_failed(status)
        who = f"remote {self.remote.name!r} (for {self.model_id!r})"
        err = refusal_error(status, data, who=who, source="remote")
        err.code = f"remote_http_{status}"  # whose refusal it was, on every surface (its message says why)
        return err

    def slot_context(self) -> tuple[int, int, int] | None:
        return None  # the remote checks the prompt length itself

    async def sees_images(self, http: aiohttp.ClientSession) -> bool | None:
        return None  # the remote answers for itself

    # ---- what the gateway asks of a target (app/lanes/target.py) -------------------------------------
    traced = True  # the client's trace goes on to the remote (its traceparent)
    relays_raw = False  # another host: TLS, proxies and pooled connections go through aiohttp
    tokenizes = False  # no tokenizer route to rely on: a prompt is counted from a one-token answer's usage

    @property
    def http(self) -> aiohttp.ClientSession:
        if self.remote.http is None:  # an AttributeError: without a session it is no Target (hasattr says so)
            raise AttributeError(f"remote {self.remote.name!r} is used outside a server's remote registry")
        return self.remote.http

    def garbled(self, path: str) -> SwitchyardError:
        return RemoteFailedError(
            f"remote {self.remote.name!r} answered {path} for {self.model_id!r} with something that is not "
            f"JSON; check that {self.remote.spec.url} is an OpenAI-compatible API"
        )

    def request_defaults(
        self, body: dict[str, Any], *, route: str, settings: Settings
    ) -> dict[str, Any] | None:
        return None  # the remote fills in its own defaults

    def draft_unsuited(self, body: dict[str, Any], *, settings: Settings) -> str | None:
        return None  # a remote's speculation is its own business

    def logprobs_partial(self, body: dict[str, Any]) -> str | None:
        return None  # likewise

    def capabilities(self) -> frozenset[str]:
        kind = self.kind
        return _KIND_CAPS.get(kind, _ANY) if kind else _ANY

    def capability_error(self, capability: str) -> CapabilityMissingError | None:
        if capability in self.capabilities():
            return None
        return CapabilityMissingError(
            f"model {self.model_id!r} is a {self.kind} model on remote {self.remote.name!r}, which cannot do "
            f"{capability} through Switchyard; pick a model that can from GET /v1/models",
            param="model",
        )


AnyLane = Lane | RemoteLane  # what the gateway holds for one request: a local engine or a remote model
