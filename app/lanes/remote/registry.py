"""The remotes of one server: registered, health-checked, resolved from `NAME/MODEL`, held per request.

The registry owns its own HTTP session (remotes are other hosts, with their own keys) and one task that
checks every remote each `remote_check_s` seconds. `remotes.json` is re-read at each round, so a remote
added or removed by a CLI that could not reach this server still shows up here. A request for a remote that
was not ready at its last check re-checks it first: a remote that came back is used at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from app.core.background import SessionOwner, cancelled
from app.core.errors import (
    BadRequestError,
    RemoteExistsError,
    RemoteNotFoundError,
    RemoteUnavailableError,
)
from app.core.events import EventBus, EventKind
from app.core.secrets import Secret
from app.core.settings import Settings
from app.lanes.remote.lane import Remote, RemoteLane, RemoteState
from app.lanes.remote.store import RemoteSpec, RemoteStore, check_name, key_env_name, normalize_url


class RemoteRegistry(SessionOwner):
    def __init__(self, store: RemoteStore, *, bus: EventBus, settings: Settings) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.remotes: dict[str, Remote] = {}
        # remotes another part owns (paired peers: app/lanes/peers/): listed and routed here, but not in
        # remotes.json, so a re-read of that file leaves them alone
        self.attached: set[str] = set()
        self._stamp: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        # this server's id on GET /v1/models (INSTANCE_HEADER): a remote whose URL leads back here says it
        self.instance = uuid.uuid4().hex

    async def __aenter__(self) -> RemoteRegistry:
        self.open_http(aiohttp.ClientSession())
        self._sync()
        self._task = asyncio.create_task(self._loop(), name="remote-checks")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancelled(self._task)
        await self.close_http()

    # ---- the file ------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Take up remotes added or removed in remotes.json since the last look."""
        try:
            st = os.stat(self.store.path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and (stamp is not None or not self.remotes):
            return
        self._stamp = stamp
        specs = {s.name: s for s in self.store.specs()}
        for name in list(self.remotes):
            if name in self.attached:
                continue
            if name not in specs or specs[name].url != self.remotes[name].spec.url:
                del self.remotes[name]
        for name, spec in specs.items():
            if name in self.attached:
                continue  # a peer took the name first (peers refuse a remote's name when they pair)
            if name in self.remotes:
                self.remotes[name].spec = spec
            else:
                self.remotes[name] = Remote(spec, bus=self.bus, key=self.store.key(name), http=self._http)

    async def _loop(self) -> None:
        while True:
            try:
                self._sync()
                await asyncio.gather(*(self._check(r) for r in list(self.remotes.values())))
            except Exception as exc:  # a damaged remotes.json must not end the checks for good
                self.bus.publish(EventKind.REMOTE_ERROR, error=str(exc))
            await asyncio.sleep(self.settings.engines.remote_check_s)

    async def _check(self, remote: Remote) -> None:
        if remote.name in self.attached:  # a peer: its own session (pinned TLS) and the key it was given
            await remote.check(
                remote.http or self.http, key=(remote.key, remote.key_source), own=self.instance
            )
            return
        if await remote.check(self.http, key=self.store.key(remote.name), own=self.instance):
            # remembered so `switchyard ls` can list them with no server running
            await asyncio.to_thread(self.store.record_seen, remote.name, remote.seen)

    # ---- changing --------------------------------------------------------------------------------------
    async def add(
        self, name: str, url: str, *, key: Secret | None, models: tuple[str, ...] = ()
    ) -> tuple[Remote, list[str]]:
        """Register and check a remote; the notes say where the key went and anything to watch out for."""
        check_name(name)
        if name in self.attached:
            raise RemoteExistsError(
                f"{name!r} is the name of a paired peer (`switchyard peers ls`); choose another remote name"
            )
        spec = RemoteSpec(name=name, url=normalize_url(url), models=models)
        stored, problem = await asyncio.to_thread(self.store.add, spec, key)
        self._sync()
        remote = self.remotes[name]
        await self._check(remote)
        if remote.is_self:  # refused: it would list this server's models again under NAME/
            await self.remove(name)
            raise BadRequestError(
                f"refusing remote {name!r}: {spec.url} is this server itself; a remote is another server",
                param="url",
            )
        return remote, notes_for(stored, key_problem=problem)

    async def remove(self, name: str) -> RemoteSpec:
        gone = await asyncio.to_thread(self.store.remove, name)
        self._sync()
        self.bus.publish(EventKind.REMOTE_REMOVED, remote=name)  # the UI and /api/events drop it at once
        return gone

    async def check(self, name: str) -> Remote:
        self._sync()
        remote = self.get(name)
        await self._check(remote)
        return remote

    def get(self, name: str) -> Remote:
        remote = self.remotes.get(name)
        if remote is None:
            known = ", ".join(self.remotes) or "none"
            raise RemoteNotFoundError(f"no remote named {name!r} (remotes: {known}); see GET /api/remotes")
        return remote

    # ---- remotes owned elsewhere (peers) -----------------------------------------------------------------
    def attach(self, remote: Remote) -> None:
        """Serve `remote` (made and owned by the caller) like a registered one until `detach`."""
        if remote.name in self.remotes and remote.name not in self.attached:
            raise RemoteExistsError(
                f"a remote named {remote.name!r} already exists (`switchyard remote ls`); pair the peer "
                "under another name (--name)"
            )
        self.attached.add(remote.name)
        self.remotes[remote.name] = remote

    def detach(self, name: str) -> None:
        """Stop serving an attached remote: its models leave every listing at once."""
        if name in self.attached:
            self.attached.discard(name)
            self.remotes.pop(name, None)
            self.bus.publish(EventKind.REMOTE_REMOVED, remote=name)

    # ---- requests ----------------------------------------------------------------------------------------
    def resolve(self, model_id: str) -> RemoteLane | None:
        """The remote lane for `NAME/MODEL`, or None when NAME is no remote (or MODEL is not allowed)."""
        name, sep, model = model_id.partition("/")
        remote = self.remotes.get(name)
        if not sep or not model or remote is None:
            return None
        if remote.spec.models and model not in remote.spec.models:
            return None
        return remote.lane(model)

    @contextlib.asynccontextmanager
    async def use(self, lane: RemoteLane) -> AsyncIterator[RemoteLane]:
        """Hold `lane` for one request: re-checked first if it was not ready, counted as in flight."""
        remote = lane.remote
        if remote.state is not RemoteState.READY:
            await self._check(remote)
        if remote.state is RemoteState.UNAUTHORIZED:
            raise remote.auth_failed(401)
        if remote.state is not RemoteState.READY:
            raise RemoteUnavailableError(remote.error or f"remote {remote.name!r} is not ready")
        with lane.request():  # the lane counts itself: in flight and last used
            yield lane

    def listing(self) -> list[dict[str, Any]]:
        """Every exposed remote model, as /v1/models lists it."""
        out = []
        for remote in self.remotes.values():
            for m in remote.models():
                out.append(
                    {
                        "id": f"{remote.name}/{m.id}",
                        "kind": m.kind or "chat",
                        "remote": remote.name,
                        "state": str(remote.state),
                    }
                )
        return out

    def public(self) -> list[dict[str, Any]]:
        return [r.public() for r in self.remotes.values()]


def notes_for(spec: RemoteSpec, *, key_problem: str | None) -> list[str]:
    notes = []
    if spec.key_kept == "keyring":
        notes.append(
            f"the key is stored in the system keyring (service 'switchyard', user 'remote:{spec.name}')"
        )
    elif spec.key_kept == "session":
        notes.append(
            f"{key_problem}, so the key is kept in this process's memory only and is gone when it stops; "
            f"to keep it across restarts set {key_env_name(spec.name)} in the server's environment"
        )
    host = spec.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if spec.key_kept and spec.url.startswith("http://") and host not in ("localhost", "127.0.0.1", "::1"):
        notes.append(
            "the URL is plain http: the key travels unencrypted to that host; use https, or a network "
            "you trust"
        )
    return notes
