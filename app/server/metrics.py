"""`GET /metrics`: Prometheus text exposition (format 0.0.4), written by hand.

Per request the front middleware (app/server/middleware.py) calls `Metrics.record` after the answer;
streams add one timestamp when the first chunk goes out (set by the proxy under FIRST_BYTE) and token
counts come from the usage the proxy found in the last bytes of the answer (USAGE). Lane figures are
read from the supervisor at scrape time, so they are exact and cost nothing between scrapes. Download
bytes are summed from the runtime's `download.progress` events (their `delta`, per `repo`) by a
subscriber that lives as long as the app (`download_counter`). State lives on a `Metrics` object in the
application (METRICS), never in module globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from app import __version__
from app.core.background import running
from app.core.events import Event, EventBus, EventKind
from app.lanes.bank.slots import BankCounters
from app.lanes.lane import Lane, LaneState
from app.server.keys import GATEWAY, RUNTIME
from app.server.request_keys import CLIENT, MODEL

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CLIENT_CLOSED = 499  # nginx's convention: the client went away before the answer was complete

# set by the handlers, read by the middleware once the request is done
FIRST_BYTE: web.RequestKey[float] = web.RequestKey("first_byte_at", float)
USAGE: web.RequestKey[tuple[int, int]] = web.RequestKey("usage", tuple)
# (drafted, accepted) tokens of speculative decoding, from llama.cpp's `timings` (absent: nothing drafted)
DRAFTS: web.RequestKey[tuple[int, int]] = web.RequestKey("drafts", tuple)
# why the lane's draft model does not pay on this request (request_defaults.draft_unsuited), when it does not
DRAFT_UNSUITED: web.RequestKey[str] = web.RequestKey("draft_unsuited", str)
# set by a stream once every byte is written: a client that leaves while the handler is still closing
# (it read the last event and hung up) cancels the handler, and that is a completed answer, not a 499
SENT_STATUS: web.RequestKey[int] = web.RequestKey("sent_status", int)


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


_Labels = tuple[str, ...]


class Metrics:
    """Counters and histograms of the gateway; `render` adds the lanes' figures at scrape time."""

    def __init__(self) -> None:
        self.requests: dict[_Labels, int] = {}  # route, method, model, status, client
        self.errors: dict[_Labels, int] = {}  # route, model, status, code, client
        self.duration: dict[_Labels, Histogram] = {}  # route, model
        self.ttfb: dict[_Labels, Histogram] = {}  # route, model
        self.tokens_in: dict[_Labels, int] = {}  # model, client
        self.tokens_out: dict[_Labels, int] = {}  # model, client
        self.drafted: dict[_Labels, int] = {}  # model
        self.accepted: dict[_Labels, int] = {}  # model
        self.draft_unsuited: dict[_Labels, int] = {}  # model, reason
        self.in_flight = 0
        self.download_bytes: dict[_Labels, int] = {}  # repo
        self.verdicts: dict[
            _Labels, int
        ] = {}  # stage, judge, verdict, blocked (app/server/gateway/safety_gate.py)
        self.judge_failures: dict[_Labels, int] = {}  # judge
        self.started = time.time()

    def record(
        self, request: web.Request, *, status: int, seconds: float, t0: float, resp: web.StreamResponse | None
    ) -> None:
        info = request.match_info
        resource = info.route.resource
        route = resource.canonical if resource is not None else "-"
        # an unknown model name is the client's text: keep it out of the labels (cardinality)
        model = str(request.get(MODEL, "-")) if status != 404 else "-"
        client = str(request.get(CLIENT, "-"))
        key = (route, request.method, model, str(status), client)
        self.requests[key] = self.requests.get(key, 0) + 1
        short = (route, model)
        hist = self.duration.get(short)
        if hist is None:
            hist = self.duration[short] = Histogram(DURATION_BUCKETS)
        hist.observe(seconds)
        first = request.get(FIRST_BYTE)
        if first is not None:
            hist = self.ttfb.get(short)
            if hist is None:
                hist = self.ttfb[short] = Histogram(TTFB_BUCKETS)
            hist.observe(max(0.0, first - t0))
        usage = request.get(USAGE)
        if usage is not None:
            tk = (model, client)
            self.tokens_in[tk] = self.tokens_in.get(tk, 0) + usage[0]
            self.tokens_out[tk] = self.tokens_out.get(tk, 0) + usage[1]
        if (drafts := request.get(DRAFTS)) is not None:
            self.drafted[(model,)] = self.drafted.get((model,), 0) + drafts[0]
            self.accepted[(model,)] = self.accepted.get((model,), 0) + drafts[1]
        if (why := request.get(DRAFT_UNSUITED)) is not None:
            self.draft_unsuited[(model, why)] = self.draft_unsuited.get((model, why), 0) + 1
        if status >= 400:
            ek = (route, model, str(status), error_code(resp), client)
            self.errors[ek] = self.errors.get(ek, 0) + 1

    def count_verdict(
        self, *, stage: str, judge: str, verdict: str, blocked: bool, failed: list[str]
    ) -> None:
        """One safety judgement: its verdict ("error": no judge answered) and each judge that failed."""
        key = (stage, judge, verdict, "true" if blocked else "false")
        self.verdicts[key] = self.verdicts.get(key, 0) + 1
        for name in failed:
            self.judge_failures[(name,)] = self.judge_failures.get((name,), 0) + 1

    def count_download(self, event: Event) -> None:
        """Add a `download.progress` event's `delta` (bytes since the previous one) under its repo."""
        if event.kind != DOWNLOAD_PROGRESS:
            return
        delta, repo = event.data.get("delta"), event.data.get("repo")
        if isinstance(delta, int) and not isinstance(delta, bool) and delta > 0:
            key = (repo if isinstance(repo, str) else "-",)
            self.download_bytes[key] = self.download_bytes.get(key, 0) + delta

    def render(self, lanes: Iterable[Lane]) -> str:
        out: list[str] = []
        _family(out, "switchyard_info", "gauge", "Switchyard's version.", {("version",): {(__version__,): 1}})
        _family(
            out,
            "switchyard_start_time_seconds",
            "gauge",
            "Unix time at which the server started.",
            {(): {(): self.started}},
        )
        _family(
            out,
            "switchyard_requests_in_flight",
            "gauge",
            "Requests being handled now.",
            {(): {(): self.in_flight}},
        )
        req_labels = ("route", "method", "model", "status", "client")
        _family(
            out, "switchyard_requests_total", "counter", "Requests answered.", {req_labels: self.requests}
        )
        err_labels = ("route", "model", "status", "code", "client")
        _family(
            out,
            "switchyard_errors_total",
            "counter",
            "Requests answered with an error status (4xx or 5xx); code is the error envelope's code.",
            {err_labels: self.errors},
        )
        _histograms(
            out,
            "switchyard_request_duration_seconds",
            "Time from a request's arrival to the end of its answer (the whole stream, for streams).",
            self.duration,
        )
        _histograms(
            out,
            "switchyard_time_to_first_byte_seconds",
            "Streams only: time from a request's arrival to the first chunk written to the client "
            "(includes a lane start).",
            self.ttfb,
        )
        tok_labels = ("model", "client")
        _family(
            out,
            "switchyard_input_tokens_total",
            "counter",
            "Prompt tokens, as the engine reported them.",
            {tok_labels: self.tokens_in},
        )
        _family(
            out,
            "switchyard_output_tokens_total",
            "counter",
            "Generated tokens, as the engine reported them.",
            {tok_labels: self.tokens_out},
        )
        _family(
            out,
            "switchyard_draft_tokens_total",
            "counter",
            "Speculative decoding: tokens drafted (n-gram or draft model), as llama.cpp reported them.",
            {("model",): self.drafted},
        )
        _family(
            out,
            "switchyard_draft_accepted_tokens_total",
            "counter",
            "Speculative decoding: drafted tokens the model accepted.",
            {("model",): self.accepted},
        )
        _family(
            out,
            "switchyard_draft_unsuited_requests_total",
            "counter",
            "Requests to a lane with a draft model that the draft does not pay on (grammar, json_schema, "
            "tools, temperature): the engine drafts for them anyway; see docs/engines.md.",
            {("model", "reason"): self.draft_unsuited},
        )
        lanes = list(lanes)
        states = {(ln.model_id, str(s)): int(ln.state is s) for ln in lanes for s in LaneState}
        _family(
            out,
            "switchyard_lane_state",
            "gauge",
            "1 for the state each lane is in, 0 for the others.",
            {("model", "state"): states},
        )
        _family(
            out,
            "switchyard_lane_restarts_total",
            "counter",
            "Times a lane was started again straight from failed.",
            {("model",): {(ln.model_id,): ln.restarts for ln in lanes}},
        )
        _family(
            out,
            "switchyard_lane_in_flight",
            "gauge",
            "Requests each lane is serving now.",
            {("model",): {(ln.model_id,): ln.in_flight for ln in lanes}},
        )
        _family(
            out,
            "switchyard_download_bytes_total",
            "counter",
            "Bytes of model files downloaded, per Hugging Face repo (resumed parts count once).",
            {("repo",): self.download_bytes},
        )
        _family(
            out,
            "switchyard_safety_verdicts_total",
            "counter",
            "Safety judgements (docs/safety.md): verdict safe, controversial, unsafe, or error (no judge "
            "answered); blocked when the policy refused the text.",
            {("stage", "judge", "verdict", "blocked"): self.verdicts},
        )
        _family(
            out,
            "switchyard_safety_judge_failures_total",
            "counter",
            "Safety judge calls that gave no verdict (unknown model, lane failure, timeout, unreadable).",
            {("judge",): self.judge_failures},
        )
        return "\n".join(out) + "\n"


def error_code(resp: web.StreamResponse | None) -> str:
    """The `code` of an OpenAI envelope (Anthropic: the error `type`; Ollama has none: `-`)."""
    body = getattr(resp, "body", None)
    if not isinstance(body, bytes) or len(body) > 65536:
        return "-"
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "-"
    if isinstance(err, dict):
        code = err.get("code") or err.get("type")
        return code if isinstance(code, str) else "-"
    return "-"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _family(
    out: list[str], name: str, kind: str, help_: str, series: dict[tuple[str, ...], dict[Any, Any]]
) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    for names, values in series.items():
        for labels in sorted(values):
            out.append(f"{name}{_labels(names, labels)} {_num(values[labels])}")


def bank_text(c: BankCounters) -> str:
    """The session bank's counters (app/lanes/bank/slots.py) since the server started."""
    out: list[str] = []
    for name, help_, value in (
        ("saves", "Slots saved into the session bank.", c.saves),
        ("restores", "Checkpoints restored from the session bank into a slot.", c.restores),
        ("hits", "Requests served by a checkpoint restored from the bank.", c.hits),
        (
            "misses",
            "Chat requests of two or more messages that no slot held a prefix of and the bank did not "
            "restore (a new conversation's first turn included).",
            c.misses,
        ),
        ("dropped", "Checkpoints dropped (superseded, over the budget).", c.dropped),
        ("saved_bytes", "Bytes of slot files saved.", c.saved_bytes),
        ("restored_bytes", "Bytes of slot files restored.", c.restored_bytes),
        ("restore_seconds", "Seconds spent restoring checkpoints.", c.restore_seconds),
        ("save_seconds", "Seconds spent saving slots.", c.save_seconds),
    ):
        _family(out, f"switchyard_session_bank_{name}_total", "counter", help_, {(): {(): value}})
    return "\n".join(out) + "\n"


def _histograms(out: list[str], name: str, help_: str, series: dict[_Labels, Histogram]) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} histogram")
    names = ("route", "model")
    for labels in sorted(series):
        h = series[labels]
        running = 0
        for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            bucket = _labels(names, labels, f'le="{le}"')
            out.append(f"{name}_bucket{bucket} {running}")
        out.append(f"{name}_sum{_labels(names, labels)} {_num(h.sum)}")
        out.append(f"{name}_count{_labels(names, labels)} {h.count}")


def usage_from(data: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from an OpenAI answer's `usage`, else llama.cpp's `timings`.

    Looks only for the last occurrence of the key (a key inside a string is escaped, so it cannot match)
    and decodes that small object alone: cheap on large bodies."""
    return _usage(data, _UNREAD)


def timings_of(data: bytes) -> dict[str, Any] | None:
    """llama.cpp's last `timings` object in `data` (an answer's last bytes), or None."""
    at = data.rfind(b'"timings":')
    return _object_at(data, at + 10) if at >= 0 else None


_UNREAD: Any = object()  # `timings` not decoded yet: _usage decodes it only where `usage` says nothing


def _usage(data: bytes, timings: dict[str, Any] | None) -> tuple[int, int] | None:
    at = data.rfind(b'"usage":')
    if at >= 0:
        usage = _object_at(data, at + 8)
        if usage is not None and isinstance(usage.get("prompt_tokens"), int):
            out = usage.get("completion_tokens", 0)
            return usage["prompt_tokens"], out if isinstance(out, int) else 0
    t = timings_of(data) if timings is _UNREAD else timings
    if t is not None and isinstance(t.get("prompt_n"), int) and isinstance(t.get("predicted_n"), int):
        cached = t.get("cache_n", 0)
        return t["prompt_n"] + (cached if isinstance(cached, int) else 0), t["predicted_n"]
    return None


def note_usage(request: web.Request, data: bytes) -> None:
    """Record an answer's token usage and speculative drafts (its last bytes suffice) for /metrics, and
    hand its timings to the speed recorder: the `timings` object is decoded once for all three."""
    timings = timings_of(data)
    if (usage := _usage(data, timings)) is not None:
        request[USAGE] = usage
    if (drafts := _drafts(timings)) is not None:
        request[DRAFTS] = drafts
    if (rt := request.app.get(RUNTIME)) is not None:  # measured speed, written off the loop
        rt.speeds.note_timings(request.get(MODEL), timings)


def drafts_from(data: bytes) -> tuple[int, int] | None:
    """(drafted, accepted) from llama.cpp's `timings`; None when it drafted nothing (it then leaves
    `draft_n` out) or the answer has no timings."""
    return _drafts(timings_of(data))


def _drafts(t: dict[str, Any] | None) -> tuple[int, int] | None:
    drafted, accepted = (t.get("draft_n"), t.get("draft_n_accepted")) if t is not None else (None, None)
    if not isinstance(drafted, int) or isinstance(drafted, bool):
        return None
    return drafted, accepted if isinstance(accepted, int) and not isinstance(accepted, bool) else 0


_DECODER = json.JSONDecoder()


def _object_at(data: bytes, start: int) -> dict[str, Any] | None:
    text = data[start : start + 4096].decode("utf-8", "replace").lstrip()
    try:
        obj, _ = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


REQUEST_DONE = EventKind.REQUEST_DONE
# routes a monitor polls or holds open: an event per call would flood the stream it reads
_QUIET_ROUTES = frozenset({"/metrics", "/api/events", "/health"})


def request_event(request: web.Request, *, status: int, seconds: float) -> dict[str, Any] | None:
    """The `request.done` event's data: route pattern (never the raw path), model, client key name,
    status, seconds and tokens. None for the quiet routes."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "-"
    if route in _QUIET_ROUTES:
        return None
    data: dict[str, Any] = {
        "route": route,
        "method": request.method,
        "model": str(request.get(MODEL, "-")) if status != 404 else "-",
        "client": str(request.get(CLIENT, "-")),
        "status": status,
        "seconds": round(seconds, 4),
    }
    if (usage := request.get(USAGE)) is not None:
        data["input_tokens"], data["output_tokens"] = usage
    return data


class Outcome:
    """What a handler came to: its response, and the status it ended with (500 until known)."""

    __slots__ = ("resp", "status")

    def __init__(self) -> None:
        self.status = 500
        self.resp: web.StreamResponse | None = None


async def handled(
    request: web.Request,
    handler: Handler,
    out: Outcome,
    *,
    shape: Callable[[web.Request, Exception], web.StreamResponse] | None = None,
) -> web.StreamResponse:
    """`handler(request)`, noting in `out` the status it ended with: its answer's, an HTTP exception's,
    or, when the client hung up, 499 (or the status of a stream it had read whole). `shape`: what
    answers an exception raised inside (it raises again what is no answer: middleware.shaped_error)."""
    try:
        try:
            out.resp = await handler(request)
        except Exception as exc:
            if shape is None:
                raise
            out.resp = shape(request, exc)
        out.status = out.resp.status
        return out.resp
    except web.HTTPException as exc:
        out.status = exc.status
        raise
    except asyncio.CancelledError:
        out.status = request.get(SENT_STATUS, CLIENT_CLOSED)
        raise


DOWNLOAD_PROGRESS = "download.progress"


def download_counter(
    stats: Metrics, bus: EventBus
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """A cleanup_ctx that subscribes to `bus` for the app's lifetime and counts download bytes."""

    @contextlib.asynccontextmanager
    async def ctx(_: web.Application) -> AsyncIterator[None]:
        async with bus.subscribe([EventKind.DOWNLOAD_PROGRESS]) as queue:

            async def drain() -> None:
                while True:
                    stats.count_download(await queue.get())

            async with running(drain(), name="metrics-downloads"):
                yield

    return ctx


METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
TAG = "Observability"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/metrics")
async def scrape(request: web.Request) -> web.Response:
    """Prometheus metrics in the text exposition format.

    Requests, errors, durations and time to first byte per route and model, tokens per model and
    client, and the state, restarts and in-flight requests of every lane (read at scrape time)."""
    lanes = request.app[RUNTIME].supervisor.lanes.values()
    text = request.app[METRICS].render(lanes) + bank_text(request.app[GATEWAY].bank.counters)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})
