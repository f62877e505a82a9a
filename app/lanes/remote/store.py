"""Registered remotes: `remotes.json` in SWITCHYARD_HOME, and where each remote's API key is kept.

The file holds, per remote: its name, base URL (ending in /v1), the optional model allow-list, where its
key was put (never the key), and the models it listed at its last check (so `switchyard ls` can show them
without a network call). Keys are looked up, first found wins:

  1. SWITCHYARD_REMOTE_KEY_<NAME> in the server's environment (NAME upper-cased, '-' and '.' as '_');
  2. the system keyring (service "switchyard", user "remote:<name>");
  3. this process's memory, where no keyring exists (headless Linux): the key lives as long as the
     process that was given it. That is why `switchyard remote add` goes through a running server.

A key is a `Secret` from the moment it is read: masked in repr, never logged, never written to disk.
remotes.json is changed only by a locked read-modify-write (app/core/statefile.py): concurrent adds and
removes from several processes all land.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from app.core import statefile
from app.core.errors import BadRequestError, RemoteExistsError, RemoteNotFoundError
from app.core.names import check_short_name
from app.core.vault import Secret, SessionVault

FILE_NAME = "remotes.json"
KEY_ENV_PREFIX = "SWITCHYARD_REMOTE_KEY_"
KEY_SOURCES = ("env", "keyring", "session")


@dataclass(frozen=True)
class SeenModel:
    id: str  # as the remote names it
    kind: str | None  # a Switchyard remote says (chat, embedding, speech, ...); vLLM and others do not


@dataclass(frozen=True)
class RemoteSpec:
    name: str
    url: str  # the OpenAI API root, ending in /v1
    models: tuple[str, ...] = ()  # allow-list; empty: every model the remote lists
    key_kept: str | None = None  # where the key was put when added: "keyring" or "session"; None: no key
    added_at: float = 0.0
    seen: tuple[SeenModel, ...] = ()  # what GET /models listed at the last good check
    seen_at: float | None = None

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "models": list(self.models),
            "key_kept": self.key_kept,
            "added_at": self.added_at,
            "seen": [{"id": m.id, "kind": m.kind} for m in self.seen],
            "seen_at": self.seen_at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RemoteSpec:
        seen = tuple(SeenModel(str(m["id"]), m.get("kind")) for m in d.get("seen") or ())
        return cls(
            name=str(d["name"]),
            url=str(d["url"]),
            models=tuple(str(m) for m in d.get("models") or ()),
            key_kept=d.get("key_kept"),
            added_at=float(d.get("added_at") or 0.0),
            seen=seen,
            seen_at=d.get("seen_at"),
        )


def check_name(name: str) -> str:
    return check_short_name(
        name,
        what="remote name",
        longest=32,
        note="no '/': its models are named NAME/MODEL",
        example="'gpu-box'",
    )


def normalize_url(url: str) -> str:
    """`http(s)://host[:port][/prefix]/v1`: a bare host gets /v1; credentials, queries and other paths are
    refused (the key goes in the keyring, not the URL)."""
    parts = urlsplit(url.strip())
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        parts = urlsplit("")
    path = parts.path.rstrip("/")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequestError(  # the URL is not echoed: a mistyped one may hold a password
            "the remote URL must be http:// or https:// with a host, e.g. http://gpu-box:8000/v1",
            param="url",
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise BadRequestError(
            "the remote URL must not carry a user, password, query or fragment: give it as "
            "http://host:port/v1 and its API key with --api-key-stdin (it is kept in the keyring)",
            param="url",
        )
    if not path:
        path = "/v1"
    if not path.endswith("/v1"):
        raise BadRequestError(
            f"the remote URL must be the OpenAI API root, ending in /v1 (got path {path!r}), "
            "e.g. http://gpu-box:8000/v1",
            param="url",
        )
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def key_env_name(name: str) -> str:
    return KEY_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


class RemoteStore(statefile.NamedRecords[RemoteSpec]):
    """The remotes of one SWITCHYARD_HOME, and the keys this process can reach."""

    list_key, noun, listing = "remotes", "remote", "switchyard remote ls"
    missing_error = RemoteNotFoundError
    repair = "fix or remove it"

    def __init__(self, path: Path, *, env: Mapping[str, str] | None = None) -> None:
        super().__init__(path)
        self._env = env
        self.vault = SessionVault()  # keyring, then this process's memory
        self._lock = threading.Lock()

    @classmethod
    def at(cls, home: Path) -> RemoteStore:
        return cls(home / FILE_NAME)

    def _record(self, data: Any) -> RemoteSpec:
        return RemoteSpec.from_json(data)

    def add(self, spec: RemoteSpec, key: Secret | None) -> tuple[RemoteSpec, str | None]:
        """Register `spec` and keep `key`; returns the stored spec and, when the key could not go into the
        keyring, why (it is then kept for this process only)."""
        check_name(spec.name)
        stored = RemoteSpec(
            name=spec.name, url=normalize_url(spec.url), models=spec.models, added_at=time.time()
        )
        problem: list[str | None] = []

        def add(specs: list[RemoteSpec]) -> list[RemoteSpec]:
            if any(s.name == spec.name for s in specs):
                raise RemoteExistsError(
                    f"a remote named {spec.name!r} already exists; remove it first "
                    f"(`switchyard remote rm {spec.name}`) to change its URL or key"
                )
            if key is None:
                return [*specs, stored]
            kept = self.vault.put(
                self.keyring_user(spec.name), key
            )  # under the lock: never over another's key
            problem.append(kept.problem)
            return [*specs, dataclasses.replace(stored, key_kept=kept.where)]

        with self._lock:
            new = self._update(add)
        return new[-1], (problem[0] if problem else None)

    def remove(self, name: str) -> RemoteSpec:
        with self._lock:
            gone = self._drop(name)
            self.vault.forget(self.keyring_user(name))
        return gone

    def record_seen(self, name: str, seen: tuple[SeenModel, ...]) -> None:
        """Remember what the remote listed (only when it changed: checks run every few seconds)."""

        def note(specs: list[RemoteSpec]) -> Any:
            if not any(s.name == name and s.seen != seen for s in specs):
                return statefile.KEEP
            now = time.time()
            return [dataclasses.replace(s, seen=seen, seen_at=now) if s.name == name else s for s in specs]

        if any(s.name == name and s.seen != seen for s in self.specs()):  # most checks change nothing
            self._update(note)

    # ---- keys ------------------------------------------------------------------------------------------
    def key(self, name: str) -> tuple[Secret | None, str | None]:
        """(key, where it came from: one of KEY_SOURCES), or (None, None)."""
        env = (os.environ if self._env is None else self._env).get(key_env_name(name), "").strip()
        if env:
            return Secret(env), "env"
        value, where, _ = self.vault.find(self.keyring_user(name))  # a broken keyring reads as no key here
        return value, where
