"""Smoke tests: one short request through a model's lane the first time it is ready on its current files.

When a lane of a chat model (on any engine that serves chat completions) or of an embedding model becomes
ready and library.db keeps no smoke test for the model's files as they are now (ModelEntry.identity(): each
file's path, size and mtime), one request goes to the engine in the background: a chat completion of at
most MAX_TOKENS tokens at temperature 0, or one embedding. Its result (ok, when, seconds, the engine, and
what came back or why it failed) is kept in library.db and shown by `ls`, GET /api/library and the Library
page. Later loads of the same files do not repeat it, a failed one included: a changed file (a new
identity) or `retest()` runs it again. A lane stopped on purpose during the test records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from typing import Any

import aiohttp

from app.core.background import all_cancelled
from app.core.errors import SwitchyardError
from app.core.events import EventBus, EventKind
from app.lanes.lane import Lane, LaneState
from app.lanes.supervisor import Supervisor
from app.library.catalog import Catalog
from app.library.model import ModelEntry
from app.library.store import Library, SmokeResult

log = logging.getLogger("switchyard.smoke")
MAX_TOKENS = 4
PROMPT = "Say OK."
TIMEOUT_S = 120.0  # a tiny answer or one vector: far longer than any engine that works needs
CRASH_WAIT_S = 1.0  # a broken connection: how long to wait for the lane to notice its engine exited


class SmokeTests:
    """Owns the running smoke tests (one per model at most); entered after the supervisor, left before."""

    def __init__(self, *, library: Library, catalog: Catalog, supervisor: Supervisor, bus: EventBus) -> None:
        self.library = library
        self.catalog = catalog
        self.supervisor = supervisor
        self.bus = bus
        self._tasks: dict[str, asyncio.Task[SmokeResult | None]] = {}

    async def __aenter__(self) -> SmokeTests:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await all_cancelled(self._tasks.values())

    def request_for(self, entry: ModelEntry) -> str | None:
        """ "chat", "embedding", or None: a model with no smoke test (rerankers, speech, images)."""
        caps = self.supervisor.capabilities(entry)
        if entry.kind == "embedding" and "embeddings" in caps:
            return "embedding"
        if entry.kind == "chat" and "chat" in caps:
            return "chat"
        return None

    def after_ready(self, lane: Lane) -> asyncio.Task[SmokeResult | None] | None:
        """Start the smoke test of `lane`'s model when one is due; its task, or None (none due, one
        running, no test for this kind of model, or the model gone from the catalog)."""
        if lane.model_id in self._tasks:
            return None
        try:
            entry = self.catalog.get(lane.model_id)
        except SwitchyardError:
            return None
        request = self.request_for(entry)
        identity = entry.identity()
        kept = self.library.smoke(entry.id).get(entry.id)
        if request is None or (kept is not None and kept.identity == identity):
            return None
        task = asyncio.create_task(self._run(lane, entry, request, identity), name=f"smoke:{entry.id}")
        self._tasks[entry.id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(entry.id, None))
        return task

    def retest(self, model_id: str) -> asyncio.Task[SmokeResult | None] | None:
        """Forget the model's kept result; test now when its lane is ready, else at its next load."""
        self.library.forget_smoke(model_id)
        lane = self.supervisor.lanes.get(model_id)
        return self.after_ready(lane) if lane is not None and lane.available else None

    async def _run(self, lane: Lane, entry: ModelEntry, request: str, identity: str) -> SmokeResult | None:
        if not lane.available:
            return None  # stopping already: the next load tests it
        at, t0 = time.time(), time.monotonic()
        try:
            # not counted in the lane's in_flight: that figure (ps, /api/lanes, the idle timer, a swap's
            # drain) is the clients' requests; a lane stopped mid-test records nothing (below)
            ok, detail = await self._ask(lane, request)
        except TimeoutError:
            ok, detail = False, f"the engine gave no answer within {TIMEOUT_S:g} s"
        except aiohttp.ClientError as exc:
            await asyncio.sleep(CRASH_WAIT_S)  # the lane notices an exited engine on its own
            if lane.state is LaneState.FAILED:
                ok, detail = False, f"the engine failed while answering: {lane.error or exc}"
            elif lane.state is not LaneState.READY:
                return None  # stopped on purpose meanwhile: not the model's doing
            else:
                ok, detail = False, f"the connection to the engine broke: {type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        engine = lane.plan.engine if lane.plan is not None else lane.engine
        result = SmokeResult(identity, ok, at, seconds, engine, request, detail)
        if not await asyncio.to_thread(self.library.put_smoke, entry.id, result):
            return None  # removed from the library meanwhile
        line = f"smoke test {'passed' if ok else 'failed'} ({request}, {seconds:.2f} s): {detail}"
        (log.info if ok else log.warning)("%s: %s", entry.id, line)
        lane.ring.add(f"--- switchyard: {line}")
        self.bus.publish(EventKind.LIBRARY_CHANGED, model=entry.id, reason="smoke", smoke=result.public())
        return result

    async def _ask(self, lane: Lane, request: str) -> tuple[bool, str]:
        """(ok, detail) of one request to the engine: its error answer, or what its answer holds."""
        if request == "chat":
            route = "/v1/chat/completions"
            body: dict[str, Any] = {
                "model": lane.served_name,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": False,
            }
        else:
            route, body = "/v1/embeddings", {"model": lane.served_name, "input": PROMPT}
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        url = lane.base_url + route
        async with self.supervisor.http.post(
            url, json=body, headers=lane.auth_headers(), timeout=timeout
        ) as r:
            status, data = r.status, await r.read()
        if status != 200:
            return False, f"the engine answered {status}: {_message(data)}"
        try:
            doc = json.loads(data)
        except ValueError:
            return False, f"the engine answered 200 with no JSON: {_message(data)}"
        return _chat_result(doc) if request == "chat" else _embedding_result(doc)


def _message(data: bytes) -> str:
    """The error message of an engine's answer (OpenAI's envelope, a bare string, or its text) on one line,
    cut short."""
    text = data.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, AttributeError):
        err = json.loads(data).get("error")
        text = str(err.get("message") or text) if isinstance(err, dict) else str(err or text)
    text = " ".join(text.split())  # one line: it is shown in a table cell's tooltip and in `ls`
    return (text[:500] + "…") if len(text) > 500 else (text or "(an empty body)")


def _chat_result(doc: object) -> tuple[bool, str]:
    choices = doc.get("choices") if isinstance(doc, dict) else None
    message = choices[0].get("message") if isinstance(choices, list) and choices else None
    if not isinstance(choices, list) or not isinstance(message, dict):
        return False, f"the engine's answer holds no chat message: {json.dumps(doc)[:300]}"
    usage = doc.get("usage") if isinstance(doc, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    text = str(message.get("content") or "")
    return True, f"answered {text[:80]!r}" + (f" ({tokens} tokens)" if isinstance(tokens, int) else "")


def _embedding_result(doc: object) -> tuple[bool, str]:
    data = doc.get("data") if isinstance(doc, dict) else None
    vector = (
        data[0].get("embedding") if isinstance(data, list) and data and isinstance(data[0], dict) else None
    )
    if not isinstance(vector, list) or not vector:
        return False, f"the engine's answer holds no embedding vector: {json.dumps(doc)[:300]}"
    finite = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in vector)
    if not finite:
        return False, f"the engine's vector of {len(vector)} numbers holds NaN, infinity or non-numbers"
    return True, f"a vector of {len(vector)} numbers"
