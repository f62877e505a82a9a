"""Answers that several steps of one lane start ask for, made once per start.

A start asks a kind whether it can start here (the kind choice), then asks it for the plan; for llama.cpp
both steps choose the runtime, which may ask `docker info` (up to 10 s). The Supervisor opens a scope per
start (`start_scope`) around both steps, and `once` keeps each answer for the scope's life. Outside a
scope (the CLI's explain, the doctor) nothing is kept: each call answers afresh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import TypeVar, cast

T = TypeVar("T")
_MEMO: ContextVar[dict[Hashable, object] | None] = ContextVar("switchyard_start_memo", default=None)


@contextlib.contextmanager
def start_scope(memo: dict[Hashable, object]) -> Iterator[None]:
    """Within: `once` keeps its answers in `memo` (one dict per start, kept between its steps)."""
    token = _MEMO.set(memo)
    try:
        yield
    finally:
        _MEMO.reset(token)


def once(key: Hashable, make: Callable[[], T]) -> T:
    """`make()`, kept under `key` while a start scope is open."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return cast(T, memo[key])
