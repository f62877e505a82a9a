"""One-time pairing codes, the lock after wrong ones, and the proofs that tie a pairing to its code.

A code is ten characters of Crockford base32 (50 bits), shown as `XXXXX-XXXXX`, valid once and for
INVITE_TTL_S. It never crosses the network: each side sends an HMAC keyed by the code over everything it
says and over the certificate fingerprints it saw, so a party in the middle (another certificate) or a
wrong code fails the proof. WRONG_LIMIT wrong codes within WRONG_WINDOW_S lock pairing for LOCK_S and void
every open invitation: guessing is bounded to a handful of tries per invitation.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import BadRequestError, PairingLockedError, PairingRefusedError

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O, U
CODE_CHARS = 10
INVITE_TTL_S = 600.0
WRONG_LIMIT = 5
WRONG_WINDOW_S = 600.0
LOCK_S = 600.0
_READ_AS = str.maketrans({"O": "0", "I": "1", "L": "1"})


def new_code() -> str:
    raw = "".join(secrets.choice(ALPHABET) for _ in range(CODE_CHARS))
    return f"{raw[:5]}-{raw[5:]}"


def normalize(code: str) -> str:
    """The code as typed, read leniently (case, dashes, spaces, O for 0, I/L for 1)."""
    clean = code.upper().replace("-", "").replace(" ", "").translate(_READ_AS)
    if len(clean) != CODE_CHARS or any(c not in ALPHABET for c in clean):
        raise BadRequestError(
            f"a pairing code is {CODE_CHARS} letters and digits, shown as XXXXX-XXXXX by "
            "`switchyard peers invite` on the other machine",
            param="code",
        )
    return clean


def proof(code: str, *, role: str, fields: Mapping[str, Any]) -> str:
    """HMAC-SHA256 keyed by the normalized code over `role` and `fields` (canonical JSON)."""
    message = json.dumps({"role": role, **fields}, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(normalize(code).encode(), message, hashlib.sha256).hexdigest()


@dataclass
class Gate:
    """The open invitations of one server and its wrong-code count. In memory: a restart voids both."""

    clock: Callable[[], float] = time.monotonic
    invites: dict[str, float] = field(default_factory=dict)  # normalized code -> expiry
    wrong: list[float] = field(default_factory=list)
    locked_until: float = 0.0

    def invite(self) -> tuple[str, float]:
        """A new code and its lifetime in seconds; refused while locked."""
        self._check_lock()
        code = new_code()
        self.invites[normalize(code)] = self.clock() + INVITE_TTL_S
        return code, INVITE_TTL_S

    def _check_lock(self) -> None:
        left = self.locked_until - self.clock()
        if left > 0:
            raise PairingLockedError(
                f"pairing is locked for {left:.0f} s more after {WRONG_LIMIT} wrong codes; wait, then make "
                "a new code with `switchyard peers invite` (the old ones were voided)"
            )

    def redeem(self, matches: Callable[[str], bool]) -> str:
        """The open code that `matches` accepts, used up; a wrong one counts toward the lock."""
        self._check_lock()
        now = self.clock()
        self.invites = {c: t for c, t in self.invites.items() if t > now}
        for code in list(self.invites):
            if matches(code):
                del self.invites[code]
                return code
        self.wrong = [t for t in self.wrong if t > now - WRONG_WINDOW_S] + [now]
        if len(self.wrong) >= WRONG_LIMIT:
            self.locked_until, self.wrong = now + LOCK_S, []
            self.invites.clear()
            raise PairingLockedError(
                f"wrong pairing code; that was {WRONG_LIMIT} in a row, so pairing is locked for "
                f"{LOCK_S:.0f} s and every open code is void; then make a new one with "
                "`switchyard peers invite`"
            )
        raise PairingRefusedError(
            "wrong pairing code (or it expired, or was used already): check the code shown by "
            "`switchyard peers invite` on that machine, or make a new one there"
        )

    def public(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "open_invitations": sum(1 for t in self.invites.values() if t > now),
            "locked_for_s": max(0.0, round(self.locked_until - now, 1)),
        }
