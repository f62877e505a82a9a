"""API keys: a random secret shown once, kept in the system keyring; on disk only a salted scrypt hash.

`keys.json` (mode 0600) in SWITCHYARD_HOME holds, per key: its client name, a short id, when it was made,
its last 4 characters and the scrypt hash with salt and parameters. The server verifies a presented key
against that file alone, so it never needs the keyring. The keyring copy (service "switchyard", user = the
key's name) is there so the user can read the secret back later. Every change of `keys.json` is a locked
read-modify-write (app/core/statefile.py), so creates and revokes from the server, the CLI and the window,
at once, lose nothing; a new key is handed out only after it is durably on disk.

Where no keyring backend exists (headless Linux without a D-Bus session), creating a key still works: the
secret is shown once and kept nowhere, and the hash on disk still verifies it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import KeyExistsError, KeyNotFoundError, SettingsError
from app.core.names import check_short_name
from app.core.paths import Paths
from app.core.public import fields_of
from app.core.vault import SERVICE, Secret, keyring_delete, keyring_get, keyring_put

PREFIX = "sy-"
ID_LEN = 8  # hex characters after the prefix; lets a presented key find its record without trying all
# 16 MiB and about 50 ms per hash: verified keys are remembered for the process, so clients pay it once
SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_CACHE_MAX = 1024
_RACY_NS = 2_000_000_000  # coarser than any file system's mtime tick (FAT: 2 s)


@dataclass(frozen=True)
class KeyInfo:
    name: str
    id: str
    created: str
    last4: str
    in_keyring: bool

    def public(self) -> dict[str, Any]:
        return fields_of(self, "name", "created", "last4", "in_keyring")  # the id stays in keys.json


@dataclass(frozen=True)
class CreatedKey:
    info: KeyInfo
    secret: Secret
    keyring_problem: str | None  # None: stored in the keyring; else why it was not

    def note(self) -> str:
        if self.keyring_problem is None:
            return (
                f"it is also stored in the system keyring (service {SERVICE!r}, user {self.info.name!r}); "
                "give it to the client now"
            )
        return (
            f"{self.keyring_problem}, so the key was not stored anywhere: copy it now, it cannot be shown "
            "again. The server checks keys against their hash on disk, so it works all the same; if it is "
            f"lost, revoke it (`switchyard keys revoke {self.info.name}`) and create a new one"
        )


def check_name(name: str) -> str:
    return check_short_name(
        name, what="key name", longest=64, note="name it after the client", example="'editor' or 'laptop'"
    )


def _digest(value: str, salt: bytes, params: dict[str, int]) -> bytes:
    return hashlib.scrypt(value.encode(), salt=salt, n=params["n"], r=params["r"], p=params["p"], dklen=32)


_KEY_RE = re.compile(rf"{PREFIX}([0-9a-f]{{{ID_LEN}}})-[A-Za-z0-9_-]{{20,}}")


def _key_id(presented: str) -> str | None:
    m = _KEY_RE.fullmatch(presented)
    return m.group(1) if m else None


def _info(rec: dict[str, Any]) -> KeyInfo:
    return KeyInfo(
        name=rec["name"],
        id=rec["id"],
        created=rec["created"],
        last4=rec["last4"],
        in_keyring=bool(rec.get("in_keyring")),
    )


class KeyStore:
    """The keys of one SWITCHYARD_HOME. Re-reads the file when it changes, so keys created or revoked by
    the CLI take effect in a running server at its next request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._records: list[dict[str, Any]] = []
        self._raw: str | None = None  # the text `_records` was parsed from
        self._read_at_ns = 0  # when the file was last read (time.time_ns)
        self._verified: dict[bytes, str] = {}  # sha256 of a key already checked -> its record id

    @classmethod
    def at(cls, paths: Paths) -> KeyStore:
        return cls(paths.home / "keys.json")

    # ---- reading -------------------------------------------------------------------------------------
    def _current(self) -> list[dict[str, Any]]:
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._stamp, self._records, self._raw = None, [], None
                self._verified.clear()
                return []
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            # a change within the file system's timestamp tick can keep size, mtime and (reused) inode:
            # while the file is that fresh, compare its text too ("racy git")
            racy = st.st_mtime_ns >= self._read_at_ns - _RACY_NS
            if stamp != self._stamp or racy:
                self._read_at_ns = time.time_ns()
                text = statefile.read_text(self.path) or ""
                if text != self._raw:
                    self._records = self._parse(text)
                    self._raw = text
                    self._verified.clear()
                self._stamp = stamp
            return self._records

    def _parse(self, text: str) -> list[dict[str, Any]]:
        try:
            raw = json.loads(text)
            records = raw["keys"]
            for r in records:
                for field in ("name", "id", "created", "last4", "salt", "hash"):
                    if not isinstance(r[field], str):
                        raise TypeError(field)
                if set(r["scrypt"]) != set(SCRYPT):
                    raise KeyError("scrypt")
        except (ValueError, KeyError, TypeError) as exc:
            raise SettingsError(
                f"{self.path} is damaged ({type(exc).__name__}: {exc}); no key in it can be checked. "
                "Remove it and create the keys again with `switchyard keys create NAME`"
            ) from exc
        return list(records)

    def entries(self) -> list[KeyInfo]:
        return [_info(r) for r in self._current()]

    def __bool__(self) -> bool:
        return bool(self._current())

    # ---- verifying -----------------------------------------------------------------------------------
    def cached(self, presented: Secret) -> str | None:
        """The client name of a key this process already verified; None when it must be checked."""
        records = self._current()
        rid = self._verified.get(hashlib.sha256(presented.reveal().encode()).digest())
        return next((r["name"] for r in records if r["id"] == rid), None) if rid else None

    def candidate(self, presented: Secret) -> bool:
        """Whether `presented` has a key's form and the id of a stored key (checked without hashing)."""
        kid = _key_id(presented.reveal())
        return kid is not None and any(r["id"] == kid for r in self._current())

    def verify(self, presented: Secret) -> str | None:
        """The client name of the key, or None. Costs one scrypt the first time a key is seen."""
        value = presented.reveal()
        kid = _key_id(value)
        rec = next((r for r in self._current() if r["id"] == kid), None) if kid else None
        if rec is None:
            return None
        got = _digest(value, bytes.fromhex(rec["salt"]), rec["scrypt"])
        if not hmac.compare_digest(got, bytes.fromhex(rec["hash"])):
            return None
        with self._lock:
            if len(self._verified) >= _CACHE_MAX:
                self._verified.clear()
            self._verified[hashlib.sha256(value.encode()).digest()] = rec["id"]
        return str(rec["name"])

    # ---- changing ------------------------------------------------------------------------------------
    def create(self, name: str) -> CreatedKey:
        """Make a key named `name`. It is returned (to be shown) only once it is durably in keys.json,
        and the name check runs under the file's lock, so concurrent creates and revokes lose nothing."""
        check_name(name)
        while True:
            made = self._create_once(name)
            if made is not None:
                return made

    def _create_once(self, name: str) -> CreatedKey | None:
        """None when the random id collided with a stored one (one chance in 4 billion): draw again."""
        kid = secrets.token_hex(ID_LEN // 2)
        secret = Secret(f"{PREFIX}{kid}-{secrets.token_urlsafe(32)}")
        salt = os.urandom(16)
        digest = _digest(secret.reveal(), salt, SCRYPT).hex()  # ~50 ms: outside the lock
        made: dict[str, Any] = {}

        def add(records: list[dict[str, Any]] | None) -> Any:
            records = records or []
            if any(r["name"] == name for r in records):
                raise KeyExistsError(
                    f"a key named {name!r} already exists; revoke it first "
                    f"(`switchyard keys revoke {name}`) or choose another name"
                )
            if any(r["id"] == kid for r in records):
                return statefile.KEEP
            made["problem"] = problem = keyring_put(name, secret)
            made["rec"] = rec = {
                "name": name,
                "id": kid,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "last4": secret.reveal()[-4:],
                "in_keyring": problem is None,
                "salt": salt.hex(),
                "scrypt": dict(SCRYPT),
                "hash": digest,
            }
            return [*records, rec]

        try:
            self._update(add)
        except BaseException:
            if made.get("problem", "") is None:  # in the keyring but not on disk: undo that
                keyring_delete(name)
            raise
        if not made:
            return None
        return CreatedKey(info=_info(made["rec"]), secret=secret, keyring_problem=made["problem"])

    def revoke(self, name: str) -> KeyInfo:
        """Delete key `name` from keys.json (under its lock, durably), then from the keyring."""
        gone: list[dict[str, Any]] = []

        def drop(records: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
            records = records or []
            gone.extend(r for r in records if r["name"] == name)
            if not gone:
                known = ", ".join(r["name"] for r in records) or "none"
                raise KeyNotFoundError(f"no key named {name!r} (keys: {known}); see `switchyard keys ls`")
            return [r for r in records if r["name"] != name]

        self._update(drop)
        keyring_delete(name)
        return _info(gone[0])

    def _update(self, change: Callable[[list[dict[str, Any]] | None], Any]) -> None:
        try:
            statefile.update(
                self.path,
                change,
                parse=self._parse,
                dump=lambda records: statefile.dump_json({"version": 1, "keys": records}),
                mode=0o600,
            )
        finally:
            with self._lock:  # re-read at the next use, whoever wrote last
                self._stamp = None
                self._verified.clear()


# ---- the system keyring (best effort: a key works without it) ------------------------------------------
def keyring_secret(name: str) -> Secret | None:
    """The secret of key `name` from the keyring, where it was stored and a keyring is available."""
    return keyring_get(name)[0]
