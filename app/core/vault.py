"""Secrets: the masked `Secret` string, the system keyring wrapped once, and the one policy for where
the keyring is missing.

Every secret Switchyard keeps (API keys, the Hugging Face token, remotes' keys) goes to the keyring under
service "switchyard". Where no backend exists (headless Linux without a D-Bus session) or the backend
refuses (locked, D-Bus gone), nothing fails: `keyring_put` says why in a sentence, and a `SessionVault`
keeps the secret in this process's memory for as long as the process lives ("kept for this session").
Reads never raise either: a missing backend is "nothing stored", a broken one a problem to report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SERVICE = "switchyard"
KEYRING = "keyring"
SESSION = "session"


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


def backend_name() -> str:
    """The keyring backend in use, as module.Class (what the user would configure or install)."""
    import keyring

    backend = type(keyring.get_keyring())
    return f"{backend.__module__}.{backend.__qualname__}"


def keyring_put(user: str, secret: Secret) -> str | None:
    """Store `secret` for `user`; None when stored, else a sentence saying why not."""
    try:
        import keyring
        from keyring.errors import NoKeyringError
    except ImportError:
        return "the keyring package is not installed"
    try:
        keyring.set_password(SERVICE, user, secret.reveal())
    except NoKeyringError:
        return f"no system keyring is available here (backend {backend_name()})"
    except Exception as exc:  # a backend fails in its own ways (locked, D-Bus gone): never fatal
        return f"the system keyring did not accept it ({type(exc).__name__})"
    return None


def keyring_get(user: str) -> tuple[Secret | None, str | None]:
    """(the stored secret or None, a problem sentence or None). No backend is not a problem: nothing
    can have been stored there."""
    try:
        import keyring
        from keyring.errors import NoKeyringError
    except ImportError:
        return None, None
    try:
        value = keyring.get_password(SERVICE, user)
    except NoKeyringError:
        return None, None
    except Exception as exc:  # locked or broken: say so, the caller keeps looking elsewhere
        return None, f"the system keyring could not be read ({type(exc).__name__})"
    return (Secret(value), None) if value else (None, None)


def keyring_delete(user: str) -> bool:
    """Remove `user`'s secret; whether one was there to remove."""
    try:
        import keyring

        if keyring.get_password(SERVICE, user) is None:
            return False
        keyring.delete_password(SERVICE, user)
    except Exception:  # no backend, or nothing stored: nothing to remove there
        return False
    return True


@dataclass(frozen=True)
class Kept:
    where: str | None  # KEYRING, SESSION, or None (the keyring refused and no session copy was wanted)
    problem: str | None  # why it is not in the keyring; None when it is


class SessionVault:
    """The keyring with this process's memory behind it. One per store object (never a module global),
    so what it holds lives exactly as long as the store that owns it."""

    def __init__(self) -> None:
        self._held: dict[str, Secret] = {}

    def put(self, user: str, secret: Secret, *, session: bool = True) -> Kept:
        """Keyring first; where it refuses, hold the secret here (unless `session` is False)."""
        problem = keyring_put(user, secret)
        if problem is None:
            self._held.pop(user, None)  # the keyring copy is the one now: no stale second copy
            return Kept(KEYRING, None)
        if not session:
            return Kept(None, problem)
        self._held[user] = secret
        return Kept(SESSION, problem)

    def hold(self, user: str, secret: Secret) -> None:
        """Keep `secret` in memory only, whatever the keyring could do."""
        self._held[user] = secret

    def find(self, user: str) -> tuple[Secret | None, str | None, str | None]:
        """(secret, KEYRING or SESSION, problem): the keyring wins over a session copy."""
        value, problem = keyring_get(user)
        if value is not None:
            return value, KEYRING, problem
        held = self._held.get(user)
        return (held, SESSION if held is not None else None, problem)

    def forget(self, user: str) -> list[str]:
        """Remove `user`'s secret from memory and the keyring; the places it was removed from."""
        removed = [SESSION] if self._held.pop(user, None) is not None else []
        if keyring_delete(user):
            removed.append(KEYRING)
        return removed
