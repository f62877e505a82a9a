"""A lane: one model on one engine, as a state machine owned by a single asyncio task.

States: stopped -> starting -> ready -> stopping -> stopped, and failed (from starting, ready or
stopping); TRANSITIONS (app/lanes/lane_machine.py) lists every move, checked in the one setter (`_set`).
Only the owner task (`_run`) assigns `state`, handling one command of its inbox at a time; every change
is published once as a `lane.state` event. Callers ask `ensure_ready()` and `stop()`; the owner decides.
Requests are counted through `request()`, and a swap waits for them in `drained()`.

A ready engine that stops answering (SIGSTOP, a deadlock) is found two ways: a request that receives no
byte for `engine_read_timeout_s` while no other request makes progress (`guard`), and a periodic check of
its health route that times out while no request makes progress (a busy llama.cpp may answer /health
late while it streams). Either reports to the owner, which kills the engine, fails the lane (ready ->
failed) and starts it again; the requests on it get EngineUnresponsiveError (504).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import psutil

from app.core.errors import (
    EngineCrashedError,
    EngineStartError,
    EngineUnresponsiveError,
    SwitchyardError,
    UpstreamRefusedError,
)
from app.core.events import EventBus, EventKind
from app.core.platform.stopped import tree_stopped
from app.core.settings import Settings
from app.lanes.engines.llamacpp.start_errors import start_advice, start_cause
from app.lanes.engines.plan import LaunchPlan
from app.lanes.footprint import Footprint, parse_footprint
from app.lanes.lane_machine import (
    TRANSITIONS,
    Close,
    Command,
    Exited,
    Hung,
    LaneState,
    Start,
    Stop,
    check_transition,
)
from app.lanes.lane_requests import (
    lane_defaults,
    lane_draft_unsuited,
    lane_logprobs_partial,
    lane_speculation,
)
from app.lanes.proc import EngineProcess, LogRing
from app.lanes.target import Counted, Progress, Requests, refusal_error

log = logging.getLogger("switchyard.lanes")
FOOTPRINT_WAIT_S = 1.0  # how long llama.cpp's buffer lines may trail its readiness before we give up on them
# a request whose connection broke this soon after its engine was killed as unresponsive is told so
HUNG_WINDOW_S = 10.0
T = TypeVar("T")
BEFORE_STOP_S = 30.0  # the most a stop waits for its hook (saving slots to the session bank)


def lane_slug(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id)


def frozen_process(pid: int) -> bool:
    """Whether the process `pid`, or one of its children, is stopped and so makes no progress (False when
    it is gone: the exit watcher reports that). Its own tree only: this runs every second on the loop."""
    return tree_stopped(pid)


class Lane(Counted):
    def __init__(
        self,
        *,
        model_id: str,
        kind: str,
        engine: str = "llama.cpp",
        plan_factory: Callable[[], LaunchPlan],
        settings: Settings,
        bus: EventBus,
        ring: LogRing,
        http: aiohttp.ClientSession,
        on_ready: Callable[[Lane], None] | None = None,
    ) -> None:
        self._on_ready = on_ready
        self.id = model_id
        self.model_id = model_id
        self.kind = kind
        self.engine = engine  # the lane id of the engine kind; the plan's, once one is made
        self._plan_factory = plan_factory
        self.settings = settings
        self.bus = bus
        self.ring = ring
        self._http = http
        self.state = LaneState.STOPPED
        self.error: str | None = None
        self.proc: EngineProcess | None = None
        self.plan: LaunchPlan | None = None
        self.port: int | None = None
        self.started_at: float | None = None
        self._requests = Requests()  # in flight, last used, idle (a drain awaits it)
        self.restarts = 0
        self._draining = False
        self.measured: Footprint | None = None
        self.ttl_override: float | None = None  # seconds (< 0: never); set per request by Ollama's keep_alive
        self._stop_requested = False
        self._since = time.monotonic()  # when the current state began (for the transition log lines)
        self._ready_for: float | None = None  # seconds the last ready spell lasted, once it ended
        self._recorder: asyncio.Task[None] | None = None
        self._log_mark = 0  # ring.added when the current engine was started
        self._vision: tuple[int | None, bool] | None = None  # (engine pid, has a projector), from /props
        self._startup: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._liveness: asyncio.Task[None] | None = None
        self.progress = Progress()
        self._hung: tuple[float, str] | None = None  # (when, the error's message) of the last hang
        # called by the owner before a ready engine is stopped (the session bank saves its slots)
        self.before_stop: Callable[[Lane], Awaitable[None]] | None = None
        self._inbox: asyncio.Queue[Command] = asyncio.Queue()
        self._owner = asyncio.create_task(self._run(), name=f"lane:{model_id}")

    # ---- public surface (callers ask; the owner decides) -------------------------------------
    @property
    def available(self) -> bool:
        """Ready and taking new requests (not draining for a swap, no stop pending)."""
        return self.state is LaneState.READY and not self.draining and not self._stop_requested

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def draining(self) -> bool:
        """Refusing new requests while a swap waits for the ones in flight (`drained()`)."""
        return self._draining

    # ---- requests and drains -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def drained(self, *, wait_s: float) -> AsyncIterator[bool]:
        """Take no new requests for the block, entered once those in flight have ended or `wait_s`
        seconds have passed; yields whether they all ended (the caller decides what a busy lane means)."""
        self._draining = True
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._requests.idle.wait(), max(0.0, wait_s))
            yield self._requests.in_flight == 0
        finally:
            self._draining = False

    @property
    def served_name(self) -> str:
        """The name the engine knows the model by (engines are started with the model id as alias)."""
        return self.model_id

    def auth_headers(self) -> dict[str, str]:
        """Headers the gateway adds for this engine: none for a local one (a remote lane sends its key)."""
        return {}

    def broken(self, exc: BaseException | None = None) -> SwitchyardError:
        """The error for a request whose connection to the engine broke (`exc`: how it broke); broken
        because its engine was just killed as unresponsive, that error (504)."""
        if self._hung is not None and time.monotonic() - self._hung[0] < HUNG_WINDOW_S:
            return EngineUnresponsiveError(self._hung[1])
        return crashed_error(self)

    # ---- hung engines ----------------------------------------------------------------------------
    async def bounded(self, aw: Awaitable[T]) -> T:
        """`aw`, bounded by the engine's read timeout counted from now (see `guard`)."""
        return await self.guard(aw, since=time.monotonic())

    async def guard(self, aw: Awaitable[T], *, since: float) -> T:
        """`aw`'s result, unless nothing comes from the engine, on this request or any other, for
        engine_read_timeout_s counted from `since` (this request's last byte): then the engine is reported
        unresponsive (killed and restarted by the owner) and EngineUnresponsiveError raised. A client that
        goes away cancels `aw` as usual: its connection is closed.

        One timer per wait, re-armed while other requests make progress, and no task: this runs once per
        event read from the engine."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        limit = self.settings.engines.engine_read_timeout_s
        hung: list[EngineUnresponsiveError] = []
        timers: list[asyncio.TimerHandle] = []

        def check() -> None:
            left = max(self.progress.at, since) + limit - time.monotonic()
            if left > 0:
                timers[0] = loop.call_later(left, check)
                return
            hung.append(
                self.unresponsive(
                    f"sent nothing for {limit:g} s (engine_read_timeout_s); raise engine_read_timeout_s "
                    "if its prompts take longer than that to read"
                )
            )
            task.cancel()

        timers.append(loop.call_later(max(self.progress.at, since) + limit - time.monotonic(), check))
        try:
            result = await aw
        except asyncio.CancelledError:
            if hung:
                task.uncancel()
                raise hung[0] from None
            raise
        finally:
            timers[0].cancel()
        self.progress.at = time.monotonic()
        return result

    def unresponsive(self, why: str) -> EngineUnresponsiveError:
        """Report the running engine as hung (`why`: what it failed to do); the owner kills it, fails the
        lane and restarts it, once however many requests report it. Returns the requests' error."""
        message = (
            f"the engine for {self.model_id!r} stopped answering: it {why}; it was stopped and is being "
            "restarted, retry the request"
        )
        if self.proc is not None and self.state is LaneState.READY:
            self._inbox.put_nowait(Hung(self.proc, message))
        return EngineUnresponsiveError(message)

    def refused(self, status: int, data: bytes) -> SwitchyardError:
        """The engine's error answer as our error (its status, message, type and code kept)."""
        return refusal_error(status, data, who=f"the engine for {self.model_id!r}", source="engine")

    def slot_context(self) -> tuple[int, int, int] | None:
        """(tokens per request, total context, parallel slots) of a llama.cpp plan; other engines check the
        prompt length themselves (None)."""
        if self.plan is None or not self.plan.llama_server:
            return None
        p = self.plan.params
        if p.ctx_size <= 0 or p.parallel <= 0:
            return None
        per = p.ctx_size // p.parallel
        cap = getattr(p, "slot_cap", 0)  # llama.cpp caps a slot at the trained context
        return (min(per, cap) if cap > 0 else per), p.ctx_size, p.parallel

    async def sees_images(self, http: aiohttp.ClientSession) -> bool | None:
        """Whether the running engine has a vision projector loaded (llama.cpp's /props), asked once per
        engine process; other engines answer for themselves (None)."""
        if self.plan is None or not self.plan.llama_server:
            return None
        key = self.proc.pid if self.proc is not None else None
        if self._vision is not None and self._vision[0] == key:
            return self._vision[1]
        try:
            async with http.get(self.base_url + "/props", timeout=aiohttp.ClientTimeout(total=10)) as r:
                props = await r.json(content_type=None) if r.status == 200 else {}
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
            return False
        modalities = props.get("modalities") if isinstance(props, dict) else None
        seen = isinstance(modalities, dict) and bool(modalities.get("vision"))
        self._vision = (key, seen)
        return seen

    # ---- what the gateway asks of a target (app/lanes/target.py) -------------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        """The session every local engine's requests go through (the supervisor's)."""
        return self._http

    traced = False  # an engine reads no trace context
    tokenizes = True  # a local engine is asked to render and tokenize (llama.cpp's routes)

    @property
    def relays_raw(self) -> bool:
        return self.base_url.startswith("http://")

    def garbled(self, path: str) -> SwitchyardError:
        return UpstreamRefusedError(
            f"the engine for {self.model_id!r} answered {path} with something that is not JSON",
            status=502,
            source="engine",
        )

    def request_defaults(
        self, body: dict[str, Any], *, route: str, settings: Settings
    ) -> dict[str, Any] | None:
        return lane_defaults(self, body, route=route, settings=settings)

    def draft_unsuited(self, body: dict[str, Any], *, settings: Settings) -> str | None:
        return lane_draft_unsuited(self, body, settings=settings)

    def logprobs_partial(self, body: dict[str, Any]) -> str | None:
        """Why `body`'s log probabilities would cover only some tokens here (speculation), or None."""
        return lane_logprobs_partial(self, body)

    async def speculation(self) -> dict[str, Any]:
        """Whether the ready engine speculates, per slot (llama.cpp's /slots)."""
        return await lane_speculation(self._http, self.base_url)

    async def ensure_ready(self) -> None:
        if self.available:
            return
        if self._startup is None or self._startup.done():
            self._startup = asyncio.get_running_loop().create_future()
            self._inbox.put_nowait(Start(self._startup))
        await asyncio.shield(self._startup)

    async def stop(self, *, reason: str = "requested") -> None:
        self._stop_requested = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(Stop(done, reason))
        await asyncio.shield(done)

    async def close(self) -> None:
        """Stop the engine and end the owner task (used at shutdown)."""
        await self.stop(reason="shutdown")
        if self._liveness is not None:
            self._liveness.cancel()
        self._inbox.put_nowait(Close())
        with contextlib.suppress(asyncio.CancelledError):
            await self._owner
        self.ring.close()

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model_id,
            "kind": self.kind,
            "engine": self.plan.engine if self.plan else self.engine,
            "runtime": self.plan.runtime if self.plan else None,
            "state": str(self.state),
            "pid": self.proc.pid if self.proc and self.proc.proc.returncode is None else None,
            "port": self.port,
            "started_at": self.started_at,
            "last_used": self.last_used,
            "in_flight": self.in_flight,
            "restarts": self.restarts,
            "error": self.error,
            "params": self.plan.public()["params"] if self.plan else None,
            "predicted": self.plan.predicted() if self.plan else None,
            "measured": self._measured_now(),
        }

    def _measured_now(self) -> dict[str, Any] | None:
        if self.measured is None or self.state is not LaneState.READY or self.proc is None:
            return None
        if self.measured.empty:  # the load lines may have arrived just after readiness
            self.measured = parse_footprint(self.ring.since(self._log_mark))
        out = self.measured.public()
        try:
            p = psutil.Process(self.proc.pid)
            out["rss_bytes"] = p.memory_info().rss + sum(
                c.memory_info().rss for c in p.children(recursive=True)
            )
        except psutil.Error:
            out["rss_bytes"] = None
        return out

    # ---- the owner task ------------------------------------------------------------------------
    def _set(self, state: LaneState, *, reason: str | None = None) -> None:
        """The one writer of `state`: a move TRANSITIONS allows, logged and published once; the same state
        again is no move; any other raises IllegalTransitionError, leaving the state as it was."""
        if state is self.state:
            return
        check_transition(self.state, state)
        previous, self.state = self.state, state
        if previous is LaneState.READY and self._liveness is not None:
            self._liveness.cancel()  # it watches a ready engine only; ended here, not at its next wake
        now = time.monotonic()
        held, self._since = now - self._since, now
        if state is not LaneState.STOPPED:  # a stop's own line tells how long the lane had been ready
            self._ready_for = held if previous is LaneState.READY else None
        engine = self.plan.engine if self.plan else self.engine
        log.info(
            "lane %s (%s): %s",
            self.model_id,
            engine,
            transition_text(state, previous, held=held, ready_for=self._ready_for, reason=reason),
        )
        self.bus.publish(
            EventKind.LANE_STATE,
            lane=self.id,
            model=self.model_id,
            state=str(state),
            previous=str(previous),
            reason=reason,
            pid=self.proc.pid if self.proc else None,
        )

    async def _run(self) -> None:
        while True:
            command = await self._inbox.get()
            if isinstance(command, Close):
                return
            try:
                await self._handle(command)
            except Exception as exc:  # the owner must survive anything; the lane records it
                self.error = f"internal error in lane owner: {exc!r}"
                log.error("lane %s: %s", self.model_id, self.error, exc_info=exc)
                if LaneState.FAILED in TRANSITIONS[self.state]:
                    self._set(LaneState.FAILED, reason=self.error)
            finally:
                if isinstance(command, Stop):  # a stop's caller is answered whatever happened
                    self._stop_requested = False
                    if not command.done.done():
                        command.done.set_result(None)

    async def _handle(self, command: Command) -> None:
        match command:
            case Start(done=fut):
                await self._handle_start(fut)
            case Stop(reason=reason):
                await self._handle_stop(reason)
            case Exited(proc=proc, rc=rc):
                self._handle_exit(proc, rc)
            case Hung(proc=proc, message=message):
                await self._handle_hung(proc, message)

    async def _handle_start(self, fut: asyncio.Future[None]) -> None:
        if self.state is LaneState.READY:
            if not fut.done():
                fut.set_result(None)
            return
        try:
            await self._start()
        except Exception as exc:  # every waiter must get an answer, whatever went wrong
            if not isinstance(exc, SwitchyardError):
                exc = EngineStartError(f"cannot start {self.model_id!r}: {type(exc).__name__}: {exc}")
                if self.state is LaneState.STARTING:
                    self._fail(exc.message)
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: waiters may have gone away
        else:
            if not fut.done():
                fut.set_result(None)

    async def _start(self) -> None:
        was_failed = self.state is LaneState.FAILED
        self.error = None
        self.port = None
        self.proc = None
        self._set(LaneState.STARTING)
        if was_failed:
            self.restarts += 1
        try:
            # off the event loop: a plan may rescan the catalog, probe runtimes, read a GGUF's layout
            self.plan = await asyncio.to_thread(self._plan_factory)
        except SwitchyardError as exc:  # model gone or broken, no runtime: the caller gets that error itself
            self._fail(exc.message)
            raise
        self._log_mark = self.ring.added  # this start's lines are read for its footprint, not the whole ring
        self.ring.add(f"--- switchyard: starting {self.model_id} with {self.plan.runtime} at {time.ctime()}")
        self.port = self.plan.port

        def on_port(port: int) -> None:
            self.port = port

        try:
            self.proc = await EngineProcess.spawn(
                self.plan.argv, env=self.plan.env, ring=self.ring, on_port=on_port, cwd=self.plan.cwd
            )
        except OSError as exc:
            msg = f"could not launch {self.plan.argv[0]}: {exc}"
            self._fail(msg)
            raise EngineStartError(f"engine for {self.model_id!r} failed to start: {msg}") from exc
        await self._await_ready(self.proc)
        self.measured = parse_footprint(self.ring.since(self._log_mark))
        self.proc.batch_output = True
        self.started_at = time.time()
        self._requests.last_used = time.time()
        proc = self.proc
        self._watcher = asyncio.create_task(self._watch_exit(proc))
        self.progress.at = time.monotonic()
        self._set(LaneState.READY)
        self._liveness = asyncio.create_task(self._check_alive(proc), name=f"liveness:{self.model_id}")
        self.bus.publish(
            EventKind.LANE_READY,
            lane=self.id,
            model=self.model_id,
            pid=self.proc.pid,
            port=self.port,
            runtime=self.plan.runtime,
            params=self.plan.public()["params"],
        )
        self._recorder = asyncio.create_task(self._record_footprint(proc))

    async def _record_footprint(self, proc: EngineProcess) -> None:
        """Hand the measured footprint to `on_ready` once it is in, off the readiness path: stderr
        (llama.cpp's buffer lines) and stdout (the ready line) are separate pipes, so those lines may
        trail readiness."""
        # only llama.cpp logs its buffer sizes; other kinds are measured by their resident memory alone
        llama = self.plan is not None and self.plan.llama_server
        deadline = time.monotonic() + (FOOTPRINT_WAIT_S if llama else 0)
        while self.measured is not None and self.measured.empty and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if proc is not self.proc or self.state is not LaneState.READY:
                return
            self.measured = parse_footprint(self.ring.since(self._log_mark))
        if self._on_ready is not None and proc is self.proc:
            try:
                self._on_ready(self)
            except Exception as exc:  # recording is a nicety; a failure must not fail the lane
                self.ring.add(f"--- switchyard: could not record the measured footprint: {exc}")

    async def _await_ready(self, proc: EngineProcess) -> None:
        """Ready when the engine says so on stdout (our workers do), else when its health route answers 200;
        the stall deadline moves while the engine shows progress."""
        plan = self.plan
        assert plan is not None
        t0 = time.monotonic()
        deadline = t0 + self.settings.engines.start_stall_s
        last_seen = proc.ring.last_output
        while True:
            if proc.proc.returncode is not None:
                await proc.drain_output()
                self._fail_exited(proc, during="start")
            if self._stop_requested:
                await proc.terminate(grace=self.settings.engines.stop_grace_s)
                self._set(LaneState.STOPPED, reason="stopped while starting")
                raise EngineStartError(f"start of {self.model_id!r} was cancelled by a stop request")
            if proc.reported_ready.is_set():
                return
            now = time.monotonic()
            if proc.ring.last_output != last_seen:
                last_seen = proc.ring.last_output
                deadline = max(deadline, now + self.settings.engines.start_stall_s)
            if now > deadline or now - t0 > self.settings.engines.start_max_s:
                await proc.terminate(grace=self.settings.engines.stop_grace_s)
                waited = now - t0
                self._fail(f"engine did not become ready within {waited:.0f} s (no progress)")
                raise EngineStartError(
                    self._with_tail(
                        f"engine for {self.model_id!r} did not become ready "
                        f"within {waited:.0f} s; raise start_stall_s if it loads slowly"
                    )
                )
            if self.port is not None:
                try:
                    async with self._http.get(
                        self.base_url + plan.health_path, timeout=aiohttp.ClientTimeout(total=2)
                    ) as r:
                        if r.status == 200:
                            return
                        if r.status == 503:  # still loading: that is progress
                            deadline = max(deadline, now + self.settings.engines.start_stall_s)
                except (TimeoutError, aiohttp.ClientError):
                    pass
            with contextlib.suppress(TimeoutError):  # woken at once by the engine's own ready line
                await asyncio.wait_for(proc.reported_ready.wait(), 0.02 if now - t0 < 1 else 0.1)

    def _start_cause(self) -> str:
        """The engine's own reason for a failed start, leading the message ("" where it logged none)."""
        if self.plan is None or not self.plan.llama_server:
            return ""
        lines = self.ring.tail(200)
        starts = [i for i, ln in enumerate(lines) if ln.startswith("--- switchyard: starting")]
        cause = start_cause(lines[starts[-1] if starts else 0 :])  # this start's lines, not an earlier one's
        if cause is None:
            return ""
        advice = start_advice(cause)
        return f"{self.engine}: {cause}{f'; {advice}' if advice else ''}; "

    def _with_tail(self, msg: str) -> str:
        tail = [ln for ln in self.ring.tail(12) if not ln.startswith("--- switchyard")]
        return msg + ("; engine log: " + " | ".join(tail) if tail else "")

    def _fail(self, reason: str) -> None:
        self.error = reason
        self._set(LaneState.FAILED, reason=reason)

    def _fail_exited(self, proc: EngineProcess, *, during: str) -> None:
        rc = proc.proc.returncode
        reason = self._with_tail(f"{self._start_cause()}engine exited with code {rc} during {during}")
        self._fail(reason)
        raise EngineStartError(f"engine for {self.model_id!r} failed to start: {reason}")

    async def _watch_exit(self, proc: EngineProcess) -> None:
        rc = await proc.proc.wait()
        await proc.drain_output(0.5)
        self._inbox.put_nowait(Exited(proc, rc))

    def _handle_exit(self, proc: EngineProcess, rc: int) -> None:
        if proc is not self.proc or self.state is not LaneState.READY:
            return  # an exit we caused (stop) or a stale process
        reason = self._with_tail(
            f"engine exited unexpectedly with code {rc} (crash, out of memory or killed)"
        )
        self.ring.add(f"--- switchyard: {reason.split(';')[0]}")
        self._fail(reason)

    async def _check_alive(self, proc: EngineProcess) -> None:
        """Every engine_liveness_s while `proc` serves: its health route must answer (any status) within
        engine_liveness_timeout_s, or some request must have made progress meanwhile."""
        every, limit = (
            self.settings.engines.engine_liveness_s,
            self.settings.engines.engine_liveness_timeout_s,
        )
        probed = time.monotonic()
        while True:
            # the process state each second: a stopped engine (SIGSTOP, a debugger) holds its clients with
            # no answer and no progress, and the health probe's timeout alone would take half a minute
            await asyncio.sleep(min(1.0, every))
            if proc is not self.proc or self.state is not LaneState.READY or self.plan is None:
                return
            if frozen_process(proc.proc.pid):
                self.unresponsive("is stopped (SIGSTOP, a debugger or a frozen cgroup), so it cannot answer")
                return
            if time.monotonic() - probed < every:
                continue
            probed = t0 = time.monotonic()
            try:
                async with self._http.get(
                    self.base_url + self.plan.health_path, timeout=aiohttp.ClientTimeout(total=limit)
                ) as r:
                    await r.read()
                continue
            except TimeoutError:
                pass
            except (aiohttp.ClientError, OSError):
                continue  # refused or reset: an exit, which the exit watcher reports with its code
            if self.progress.at >= t0:
                continue  # bytes flowed on a request meanwhile: busy, not hung
            self.unresponsive(
                f"did not answer its health route within {limit:g} s (engine_liveness_timeout_s)"
            )
            return

    async def _handle_hung(self, proc: EngineProcess, message: str) -> None:
        if proc is not self.proc or self.state is not LaneState.READY:
            return  # reported already (several requests saw it), or a process since replaced
        self._hung = (time.monotonic(), message)
        self.ring.add(f"--- switchyard: {message.split(';')[0]}; killing it")
        self._fail(message.removeprefix(f"the engine for {self.model_id!r} ").split(";")[0])
        await proc.terminate(grace=0)  # hung: SIGTERM would wait in a stopped process's queue
        if self._stop_requested:
            return  # a stop is queued: the lane is not wanted running
        if self._startup is None or self._startup.done():
            self._startup = asyncio.get_running_loop().create_future()
            self._inbox.put_nowait(Start(self._startup))

    async def _handle_stop(self, reason: str) -> None:
        if self.state in (LaneState.STOPPED, LaneState.FAILED) and (
            self.proc is None or self.proc.proc.returncode is not None
        ):
            if self.state is LaneState.FAILED:
                self._set(LaneState.STOPPED, reason=reason)
            return
        was_ready = self.state is LaneState.READY
        self._set(LaneState.STOPPING, reason=reason)
        if was_ready and self.before_stop is not None and self.proc is not None:
            await self._before_stop(self.before_stop)
        if self.proc is not None:
            rc = await self.proc.terminate(grace=self.settings.engines.stop_grace_s)
            self.ring.add(f"--- switchyard: engine stopped ({reason}), exit code {rc}")
        self.port = None
        self._draining = False
        self.ttl_override = None
        self._set(LaneState.STOPPED, reason=reason)

    async def _before_stop(self, hook: Callable[[Lane], Awaitable[None]]) -> None:
        """The stop hook, bounded: a hook that fails or hangs never keeps the engine from stopping."""
        try:
            async with asyncio.timeout(BEFORE_STOP_S):
                await hook(self)
        except Exception as exc:  # the stop goes on whatever the hook did
            log.warning("before stopping %s: %s: %s", self.model_id, type(exc).__name__, exc)


def transition_text(
    state: LaneState, previous: LaneState, *, held: float, ready_for: float | None, reason: str | None
) -> str:
    """A transition as the server log tells it: the new state, why, and how long the previous one lasted
    (`held`; `ready_for`: how long the lane served before the stop that is ending)."""
    why = (reason or "").split("; engine log:")[0]  # the engine's own lines are in the lane's log
    if state is LaneState.STARTING:
        return "starting" + (" again after a failure" if previous is LaneState.FAILED else "")
    if state is LaneState.READY:
        return f"ready in {held:.2f} s"
    if state is LaneState.FAILED:
        return f"failed: {why} after {held:.1f} s {previous}"
    if state is LaneState.STOPPED and previous is LaneState.STOPPING and ready_for is not None:
        return f"stopped ({why}) after {ready_for:.1f} s ready; the stop took {held:.2f} s"
    return f"{state} ({why}) after {held:.1f} s {previous}"


def crashed_error(lane: Lane) -> EngineCrashedError:
    detail = lane.error or "the connection to the engine broke"
    return EngineCrashedError(
        f"the engine for {lane.model_id!r} failed mid-request: {detail}; "
        "retry the request (the lane restarts on demand)"
    )
