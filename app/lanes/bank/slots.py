"""SessionBank: which llama.cpp slot each request goes to, what every slot holds, and the bank's traffic.

`GET /slots` never tells a slot's tokens, so the bank keeps its own book per running engine: for each slot,
the message fingerprints of the conversation last sent to it. A chat request goes to the slot already
holding the longest prefix of its messages; when no slot does, the bank's best checkpoint (longest
matching prefix, verified first) is restored into a free slot. Either way the request carries `id_slot`,
so llama.cpp reuses the cached prefix. When the lane stops, every slot holding a conversation that is not
in the bank yet is saved (`POST /slots/{id}?action=save`). Requests with `cache_prompt: false`, plain
completions and a client's own `id_slot` leave their slot unbanked.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from app.lanes.bank.sessions import (
    MIB,
    BankStore,
    Checkpoint,
    Identity,
    file_sha256,
    fingerprints,
    new_checkpoint_id,
)
from app.lanes.engines.llamacpp.kind import xllamacpp
from app.lanes.lane import Lane
from app.lanes.target import Target

log = logging.getLogger("switchyard.bank")
_SLOT_CALL = aiohttp.ClientTimeout(total=60)
# what else shapes the engine's state for the messages: a different value is a different cache. `lora` is
# the per-request adapter scales (a BASE+ADAPTER id on its base's lane): a base model's checkpoint is not
# an adapter's, and the other way round
_SEED_KEYS = ("tools", "chat_template_kwargs", "lora")


@dataclass
class Held:
    """What one slot holds by our book: a conversation's fingerprints, and the checkpoint it is already
    banked as (None: changed since, so a stop saves it)."""

    fps: tuple[str, ...]
    banked: str | None = None
    used: float = field(default_factory=time.monotonic)


@dataclass
class Book:
    pid: int
    slots: list[Held | None]
    busy: list[int]
    identity: asyncio.Task[Identity] | None = None  # worked out once per engine, off the request path

    def free(self) -> list[int]:
        return [i for i, n in enumerate(self.busy) if n == 0]

    def spare(self) -> int:
        """A slot for a new conversation: a free empty one, else the free one used longest ago, else the
        least busy (llama.cpp queues a request for a busy slot)."""
        free = self.free()
        if not free:
            return min(range(len(self.busy)), key=lambda i: self.busy[i])
        empty = [i for i in free if self.slots[i] is None]
        if empty:
            return empty[0]
        return min(free, key=lambda i: self.slots[i].used if self.slots[i] else 0.0)  # type: ignore[union-attr]

    def match(self, fps: tuple[str, ...]) -> tuple[int, int]:
        """(slot, messages shared) of the free slot holding the longest prefix of `fps`; (-1, 0) if none."""
        best = (-1, 0)
        for i in self.free():
            held = self.slots[i]
            if held is None or not held.fps or len(held.fps) > len(fps):
                continue
            n = len(held.fps)
            if fps[n - 1] == held.fps[-1] and n > best[1]:
                best = (i, n)
        return best


@dataclass
class BankCounters:
    saves: int = 0
    restores: int = 0
    hits: int = 0
    misses: int = 0
    dropped: int = 0
    saved_bytes: int = 0
    restored_bytes: int = 0
    restore_seconds: float = 0.0
    save_seconds: float = 0.0


class SessionBank:
    """One per server (kept by the Gateway). Book-keeping runs on the event loop; the store's SQLite and
    hashing run in worker threads."""

    def __init__(self, home: Path, *, budget_bytes: int, known_sha256: Callable[[str], str | None]) -> None:
        self.store = BankStore(home, budget_bytes=budget_bytes)
        self._known_sha256 = known_sha256  # the catalog's sha256 of a model's file, where it has one
        self.counters = BankCounters()
        self._books: dict[str, Book] = {}
        self._claims: dict[asyncio.Task[Any], tuple[Book, int]] = {}

    # ---- the slot choice ------------------------------------------------------------------------------
    @staticmethod
    def banks(lane: Lane) -> bool:
        """Whether `lane` runs a llama.cpp chat engine started with a bank folder (banking on)."""
        plan = lane.plan
        return (
            plan is not None
            and plan.llama_server  # /slots save and restore are llama-server's
            and bool(getattr(plan.params, "slot_save_path", ""))
            and not getattr(plan.params, "mmproj_path", "")  # llama.cpp saves no slot of a vision model
            and lane.proc is not None
        )

    async def route(
        self, target: Target, body: dict[str, Any], *, route: str, http: aiohttp.ClientSession
    ) -> dict[str, Any] | None:
        """`body` with the `id_slot` this request should use (a checkpoint restored there first when that
        saves re-reading a banked prefix), or None where the bank has no say (a remote has no slots of
        ours)."""
        if route not in ("chat", "completions") or not isinstance(target, Lane) or not self.banks(target):
            return None
        lane = target
        book = self._book(lane)
        if book.identity is None:  # hashing a large model file must not wait for the lane's first stop
            self._start_identity(lane, book, http)
        messages = body.get("messages")
        if isinstance(body.get("id_slot"), int) and 0 <= body["id_slot"] < len(book.slots):
            self._claim(book, body["id_slot"], None)  # the client's own choice: its content is unknown
            return None
        if route != "chat" or not isinstance(messages, list) or body.get("cache_prompt") is False:
            return {**body, "id_slot": self._claim(book, book.spare(), None)}
        fps = fingerprints(messages, seed={k: body.get(k) for k in _SEED_KEYS})
        slot, shared = book.match(fps)
        if shared == 0 and len(fps) >= 2:
            try:
                slot = await self._restore(lane, book, fps, http=http)
            except (OSError, sqlite3.Error) as exc:  # a broken bank costs the warm start, never the request
                log.warning("session bank: cannot look up %s: %s: %s", lane.model_id, type(exc).__name__, exc)
                slot = -1
        if slot < 0:
            slot = book.spare()
        return {**body, "id_slot": self._claim(book, slot, Held(fps))}

    def release(self) -> None:
        """The current request ended: its slot is free again."""
        task = asyncio.current_task()
        claim = self._claims.pop(task, None) if task is not None else None
        if claim is not None:
            book, slot = claim
            book.busy[slot] = max(0, book.busy[slot] - 1)

    def _claim(self, book: Book, slot: int, held: Held | None) -> int:
        book.busy[slot] += 1
        book.slots[slot] = held
        if (task := asyncio.current_task()) is not None:
            self._claims[task] = (book, slot)
        return slot

    def _book(self, lane: Lane) -> Book:
        assert lane.proc is not None and lane.plan is not None
        book = self._books.get(lane.id)
        if book is None or book.pid != lane.proc.pid:  # a new engine process starts with empty slots
            n = int(lane.plan.params.parallel)
            book = self._books[lane.id] = Book(lane.proc.pid, [None] * n, [0] * n)
        return book

    async def _identity(self, lane: Lane, http: aiohttp.ClientSession) -> Identity:
        """The model file's sha256, the engine's version and the context settings of `lane`'s engine."""
        p = lane.plan.params if lane.plan is not None else None
        assert p is not None
        known = self._known_sha256(lane.model_id)
        sha = await asyncio.to_thread(self.store.model_sha256, Path(p.model_path), known=known)
        ctx = f"slot_ctx={p.ctx_size // max(1, p.parallel)} kv={p.kv_type} fa={p.flash_attn}"
        return Identity(sha, await _engine_version(lane, http), ctx)

    def _start_identity(self, lane: Lane, book: Book, http: aiohttp.ClientSession) -> asyncio.Task[Identity]:
        task = asyncio.create_task(self._identity(lane, http), name=f"bank-id:{lane.id}")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
        book.identity = task
        return task

    async def _identity_of(self, lane: Lane, book: Book, http: aiohttp.ClientSession) -> Identity | None:
        """The identity of `lane`'s engine, or None (logged) when it cannot be known: nothing is restored
        or saved without it."""
        task = book.identity or self._start_identity(lane, book, http)
        try:
            return await asyncio.shield(task)
        except (OSError, sqlite3.Error) as exc:
            log.warning("session bank: no identity for %s (%s: %s)", lane.model_id, type(exc).__name__, exc)
            return None

    async def _restore(
        self, lane: Lane, book: Book, fps: tuple[str, ...], *, http: aiohttp.ClientSession
    ) -> int:
        """The slot the best banked checkpoint for `fps` was restored into, or -1 (a miss)."""
        if not await asyncio.to_thread(self.store.holds, lane.model_id):
            self.counters.misses += 1
            return -1
        identity = await self._identity_of(lane, book, http)
        if identity is None:
            self.counters.misses += 1
            return -1
        found = await asyncio.to_thread(self.store.best, lane.model_id, identity, fps)
        if found is None or not await asyncio.to_thread(self.store.verified, found[0]):
            self.counters.misses += 1
            return -1
        cp, _ = found
        slot = book.spare()
        book.busy[slot] += 1  # held while restoring, so no other request picks it
        if (held := book.slots[slot]) is not None and held.fps and held.banked is None:
            await self._save(lane, book, slot, held, http=http)  # the conversation it holds stays warm too
        t0 = time.perf_counter()
        try:
            answer = await _slot_action(http, lane, slot, "restore", cp.filename)
        except SlotCallError as exc:
            log.warning("session bank: restoring %s into %s failed: %s", cp.id, lane.model_id, exc)
            book.slots[slot] = None
            self.counters.misses += 1
            return -1
        finally:
            book.busy[slot] -= 1
        seconds = time.perf_counter() - t0
        self.counters.restores += 1
        self.counters.hits += 1
        self.counters.restore_seconds += seconds
        self.counters.restored_bytes += int(answer.get("n_read") or cp.size)
        book.slots[slot] = Held(cp.fingerprints, banked=cp.id)
        await asyncio.to_thread(self.store.touch, cp.id)
        log.info(
            "session bank: restored %s (%d tokens) for %s in %.3f s", cp.id, cp.tokens, lane.model_id, seconds
        )
        return slot

    # ---- the stop hook --------------------------------------------------------------------------------
    async def save_slots(self, lane: Lane, *, http: aiohttp.ClientSession) -> None:
        """Save every slot holding a conversation the bank does not have yet (Lane.before_stop)."""
        book = self._books.pop(lane.id, None)
        if book is None or lane.proc is None or book.pid != lane.proc.pid or not self.banks(lane):
            return
        for slot, held in enumerate(book.slots):
            if held is None or not held.fps:
                continue
            if held.banked is not None and await asyncio.to_thread(self.store.touch, held.banked):
                continue  # in the bank as it is (a checkpoint cleared meanwhile is saved again)
            await self._save(lane, book, slot, held, http=http)

    async def _save(
        self, lane: Lane, book: Book, slot: int, held: Held, *, http: aiohttp.ClientSession
    ) -> None:
        identity = await self._identity_of(lane, book, http)
        if identity is None:
            return
        cid = new_checkpoint_id()
        t0 = time.perf_counter()
        path = self.store.slots / f"{cid}.bin"
        try:
            answer = await _slot_action(http, lane, slot, "save", f"{cid}.bin")
        except SlotCallError as exc:
            path.unlink(missing_ok=True)  # a save that failed (a full disk) leaves no file nobody counts
            log.warning("session bank: saving slot %d of %s failed: %s", slot, lane.model_id, exc)
            return
        seconds = time.perf_counter() - t0
        tokens = int(answer.get("n_saved") or 0)
        if tokens == 0:
            path.unlink(missing_ok=True)
            return
        try:
            await self._index(lane, slot, cid, identity=identity, held=held, tokens=tokens, seconds=seconds)
        except (OSError, sqlite3.Error) as exc:
            path.unlink(missing_ok=True)
            log.warning(
                "session bank: saving slot %d of %s failed: %s: %s",
                slot,
                lane.model_id,
                type(exc).__name__,
                exc,
            )

    async def _index(
        self, lane: Lane, slot: int, cid: str, *, identity: Identity, held: Held, tokens: int, seconds: float
    ) -> None:
        """Put a saved slot file into the index (and count it)."""
        path = self.store.slots / f"{cid}.bin"
        size = path.stat().st_size
        p = lane.plan.params if lane.plan is not None else None
        now = time.time()
        cp = Checkpoint(
            id=cid,
            model_id=lane.model_id,
            identity=identity,
            n_ctx=int(p.ctx_size // max(1, p.parallel)) if p is not None else 0,
            tokens=tokens,
            fingerprints=held.fps,
            size=size,
            sha256=await asyncio.to_thread(file_sha256, path),
            created=now,
            last_used=now,
        )
        dropped = await asyncio.to_thread(self.store.add, cp)
        self.counters.saves += 1
        self.counters.saved_bytes += size
        self.counters.save_seconds += seconds
        self.counters.dropped += len(dropped)
        log.info(
            "session bank: saved slot %d of %s as %s (%d tokens, %.1f MiB) in %.3f s",
            slot,
            lane.model_id,
            cid,
            tokens,
            size / MIB,
            seconds,
        )


class SlotCallError(Exception):
    """A /slots save or restore the engine refused or did not answer."""


async def _slot_action(
    http: aiohttp.ClientSession, lane: Lane, slot: int, action: str, filename: str
) -> dict[str, Any]:
    url = f"{lane.base_url}/slots/{slot}?action={action}"
    try:
        async with http.post(url, json={"filename": filename}, timeout=_SLOT_CALL) as r:
            data = await r.json(content_type=None)
            if r.status != 200 or not isinstance(data, dict):
                raise SlotCallError(f"HTTP {r.status}: {str(data)[:200]}")
            return data
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
        raise SlotCallError(f"{type(exc).__name__}: {exc}") from exc


async def _engine_version(lane: Lane, http: aiohttp.ClientSession) -> str:
    """The engine build: the xllamacpp wheel's version (its build_info says only b0-unknown), plus
    llama.cpp's own build_info from /props."""
    build = "?"
    try:
        async with http.get(lane.base_url + "/props", timeout=aiohttp.ClientTimeout(total=10)) as r:
            props = await r.json(content_type=None) if r.status == 200 else {}
            build = str(props.get("build_info") or "?") if isinstance(props, dict) else "?"
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
        pass
    runtime = lane.plan.runtime if lane.plan is not None else "?"
    if runtime == "xllamacpp":
        found = await asyncio.to_thread(xllamacpp)
        runtime = f"xllamacpp {found.version if found is not None else '?'}"
    return f"{runtime} {build}"
