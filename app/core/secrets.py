"""API keys: a random secret shown once, kept in the system keyring; on disk only a salted scrypt hash.

`keys.json` (mode 0600) in SWITCHYARD_HOME holds, per key: its client name, a short id, when it was made,
its last 4 characters and the scrypt hash with salt and parameters. The server verifies a presented key
against that file alone, so it never needs the keyring. The keyring copy (service "switchyard", user = the
key's name) is there so the user can read the secret back later.

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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.errors import BadRequestError, KeyExistsError, KeyNotFoundError, SettingsError
from app.core.paths import Paths

SERVICE = "switchyard"
PREFIX = "sy-"
ID_LEN = 8  # hex characters after the prefix; lets a presented key find its record without trying all
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# 16 MiB and about 50 ms per hash: verified keys are remembered for the process, so clients pay it once
SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_CACHE_MAX = 1024


class Secret:
    """A secret string that does not show itself: repr, str and f-strings print a mask."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not picklable")


@dataclass(frozen=True)
class KeyInfo:
    name: str
    id: str
    created: str
    last4: str
    in_keyring: bool

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "created": self.created,
            "last4": self.last4,
            "in_keyring": self.in_keyring,
        }


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
    if not NAME_RE.fullmatch(name):
        raise BadRequestError(
            f"key name {name!r} is not allowed; use 1-64 letters, digits, '.', '_' or '-' "
            "(name it after the client, e.g. 'editor' or 'laptop')",
            param="name",
        )
    return name


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
                self._stamp, self._records = None, []
                self._verified.clear()
                return []
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self._records = self._parse()
                self._stamp = stamp
                self._verified.clear()
            return self._records

    def _parse(self) -> list[dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
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
        check_name(name)
        records = list(self._current())
        if any(r["name"] == name for r in records):
            raise KeyExistsError(
                f"a key named {name!r} already exists; revoke it first (`switchyard keys revoke {name}`) "
                "or choose another name"
            )
        taken = {r["id"] for r in records}
        kid = secrets.token_hex(ID_LEN // 2)
        while kid in taken:
            kid = secrets.token_hex(ID_LEN // 2)
        secret = Secret(f"{PREFIX}{kid}-{secrets.token_urlsafe(32)}")
        salt = os.urandom(16)
        problem = keyring_store(name, secret)
        rec = {
            "name": name,
            "id": kid,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "last4": secret.reveal()[-4:],
            "in_keyring": problem is None,
            "salt": salt.hex(),
            "scrypt": dict(SCRYPT),
            "hash": _digest(secret.reveal(), salt, SCRYPT).hex(),
        }
        try:
            self._write([*records, rec])
        except BaseException:
            if problem is None:
                keyring_delete(name)
            raise
        return CreatedKey(info=_info(rec), secret=secret, keyring_problem=problem)

    def revoke(self, name: str) -> KeyInfo:
        records = list(self._current())
        gone = next((r for r in records if r["name"] == name), None)
        if gone is None:
            known = ", ".join(r["name"] for r in records) or "none"
            raise KeyNotFoundError(f"no key named {name!r} (keys: {known}); see `switchyard keys list`")
        self._write([r for r in records if r is not gone])
        keyring_delete(name)
        return _info(gone)

    def _write(self, records: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "keys": records}, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a leftover file
        os.replace(tmp, self.path)


# ---- the system keyring (best effort: a key works without it) ------------------------------------------
def keyring_store(name: str, secret: Secret) -> str | None:
    """Store the secret; None when stored, else a sentence saying why not."""
    try:
        import keyring
        from keyring.errors import NoKeyringError
    except ImportError:
        return "the keyring package is not installed"
    try:
        keyring.set_password(SERVICE, name, secret.reveal())
    except NoKeyringError:
        backend = type(keyring.get_keyring())
        return f"no system keyring is available here (backend {backend.__module__}.{backend.__qualname__})"
    except Exception as exc:  # a backend may fail in its own ways (locked, D-Bus gone): never fatal
        return f"the system keyring did not accept it ({type(exc).__name__})"
    return None


def keyring_delete(name: str) -> None:
    try:
        import keyring

        keyring.delete_password(SERVICE, name)
    except Exception:  # nothing stored, or no keyring: the key is revoked on disk either way
        pass


def keyring_secret(name: str) -> Secret | None:
    """The secret of key `name` from the keyring, where it was stored and a keyring is available."""
    try:
        import keyring

        value = keyring.get_password(SERVICE, name)
    except Exception:
        return None
    return Secret(value) if value else None
