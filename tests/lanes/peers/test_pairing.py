"""The pairing codes, their proofs and the wrong-code lock (pure: a clock of our own)."""

from __future__ import annotations

import pytest

from app.core.errors import BadRequestError, PairingLockedError, PairingRefusedError
from app.lanes.peers import pairing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_codes_read_leniently_and_refuse_other_shapes() -> None:
    code = pairing.new_code()
    assert len(code) == 11 and code[5] == "-"
    assert pairing.normalize(code.lower().replace("-", " ")) == code.replace("-", "")
    assert pairing.normalize("o1il0-abcde") == "0111" + "0ABCDE"
    with pytest.raises(BadRequestError, match="XXXXX-XXXXX"):
        pairing.normalize("ABCD")
    with pytest.raises(BadRequestError):
        pairing.normalize("ABCDE-FGHIU")  # U is no Crockford digit


def test_a_proof_binds_code_role_and_every_field() -> None:
    fields = {"seen": "AA:BB", "key": "k"}
    base = pairing.proof("ABCDE-FGHJK", role="join", fields=fields)
    assert base == pairing.proof("abcde fghjk", role="join", fields=dict(reversed(fields.items())))
    assert base != pairing.proof("ABCDE-FGHJM", role="join", fields=fields)
    assert base != pairing.proof("ABCDE-FGHJK", role="host", fields=fields)
    assert base != pairing.proof("ABCDE-FGHJK", role="join", fields={**fields, "seen": "AA:BC"})


def test_one_use_expiry_and_the_lock() -> None:
    clock = Clock()
    gate = pairing.Gate(clock=clock)
    code, _ = gate.invite()
    right = pairing.normalize(code)
    assert gate.redeem(lambda c: c == right) == right
    with pytest.raises(PairingRefusedError):
        gate.redeem(lambda c: c == right)  # used up: a wrong code now (1)
    code, ttl = gate.invite()
    clock.now += ttl + 1
    with pytest.raises(PairingRefusedError):
        gate.redeem(lambda c: True)  # expired: nothing matches (2; the first left the window meanwhile)
    held, _ = gate.invite()
    for _ in range(3):  # (3), (4), (5)
        with pytest.raises(PairingRefusedError):
            gate.redeem(lambda c: False)
    with pytest.raises(PairingLockedError, match="locked for 600 s"):
        gate.redeem(lambda c: False)  # (6), the fifth in the window: locked, and every open code void
    with pytest.raises(PairingLockedError):
        gate.redeem(lambda c: True)
    with pytest.raises(PairingLockedError):
        gate.invite()
    clock.now += pairing.LOCK_S + 1
    assert gate.public() == {"open_invitations": 0, "locked_for_s": 0.0}
    code, _ = gate.invite()  # after the lock: pairing works again, the held code does not
    with pytest.raises(PairingRefusedError):
        gate.redeem(lambda c: c == pairing.normalize(held))
    assert gate.redeem(lambda c: c == pairing.normalize(code)) == pairing.normalize(code)


def test_wrong_codes_far_apart_do_not_lock() -> None:
    clock = Clock()
    gate = pairing.Gate(clock=clock)
    for _ in range(pairing.WRONG_LIMIT * 2):
        with pytest.raises(PairingRefusedError):
            gate.redeem(lambda c: False)
        clock.now += pairing.WRONG_WINDOW_S / (pairing.WRONG_LIMIT - 1) + 1
    gate.invite()
