"""The lane's state machine on paper: its states, the moves between them, and the commands its owner task
reads from its inbox (app/lanes/lane.py runs it).

    stopped  -> starting
    starting -> ready | failed | stopped (a stop asked for while it starts)
    ready    -> stopping | failed (the engine exited or hung)
    stopping -> stopped | failed (the stop itself broke)
    failed   -> starting (restart) | stopping (a process still to end) | stopped
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum

from app.lanes.proc import EngineProcess


class LaneState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


# every move the owner may make; anything else is a bug in the lane (IllegalTransitionError)
TRANSITIONS: dict[LaneState, frozenset[LaneState]] = {
    LaneState.STOPPED: frozenset({LaneState.STARTING}),
    LaneState.STARTING: frozenset({LaneState.READY, LaneState.FAILED, LaneState.STOPPED}),
    LaneState.READY: frozenset({LaneState.STOPPING, LaneState.FAILED}),
    LaneState.STOPPING: frozenset({LaneState.STOPPED, LaneState.FAILED}),
    LaneState.FAILED: frozenset({LaneState.STARTING, LaneState.STOPPING, LaneState.STOPPED}),
}


class IllegalTransitionError(RuntimeError):
    """A lane was asked to move where TRANSITIONS does not allow: a bug in the lane's owner, never a
    user's mistake, so it stays outside the user-facing error tree."""


def check_transition(previous: LaneState, state: LaneState) -> None:
    """Raise IllegalTransitionError unless TRANSITIONS allows `previous` -> `state`."""
    if state not in TRANSITIONS[previous]:
        allowed = ", ".join(sorted(TRANSITIONS[previous])) or "nothing"
        raise IllegalTransitionError(f"lane cannot go {previous} -> {state}; from {previous}: {allowed}")


# ---- the owner's inbox: one command per message --------------------------------------------------------
@dataclass(frozen=True)
class Start:
    """Make the lane ready; `done` gets the outcome (an exception when the start fails)."""

    done: asyncio.Future[None]


@dataclass(frozen=True)
class Stop:
    """Stop the engine (`reason` is logged and published); `done` is answered once it is handled."""

    done: asyncio.Future[None]
    reason: str


@dataclass(frozen=True)
class Exited:
    """The engine process `proc` exited by itself with code `rc`."""

    proc: EngineProcess
    rc: int


@dataclass(frozen=True)
class Hung:
    """The engine process `proc` stopped answering; `message` is what its requests were told."""

    proc: EngineProcess
    message: str


@dataclass(frozen=True)
class Close:
    """End the owner task (after a stop, at shutdown)."""


Command = Start | Stop | Exited | Hung | Close
