"""Traces: OpenTelemetry spans for requests and job steps when they are asked for, and nothing when not.

`span(name, **attrs)` is what the code calls, around any step (resolve, the wait for a lane, the engine
call, the stream, a judge). Work whose steps are not one block of code (a job, moved step by step by
events) opens a span with `open_span` and ends it itself. While tracing is off (the default: no
`tracing_otlp_endpoint`, or the `opentelemetry-sdk` package absent) `span` returns one shared null
context: opentelemetry is never imported, and a span costs one global read and a call. While it is on,
spans go to a TracerProvider of our own (not OpenTelemetry's global one, which a library in the same
process may have set up), exported over OTLP/HTTP (`exporting`), or to the exporter a test installs
(`install`, with the SDK's InMemorySpanExporter).

The W3C `traceparent` header carries a trace between processes: `server_span` continues the trace a
client sent, and `inject` adds the current span's header to a request for a remote lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the types only: importing the SDK is what "off" must never do
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("switchyard.tracing")
Attr = str | int | float | bool | None
OTLP_TRACES = "/v1/traces"
PREFIX = "switchyard."  # keyword attributes are ours: `span("x", model="m")` sets switchyard.model
INSTALL_HINT = "pip install 'switchyard[tracing]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"


class SpanLike(Protocol):
    """What a caller may do with the span it holds: the SDK's Span, or the null span while tracing is off."""

    def set_attribute(self, key: str, value: Any) -> None: ...

    def is_recording(self) -> bool: ...


class OpenSpan(SpanLike, Protocol):
    """A span its opener ends (`open_span`): it is never the current span, so it may end in another task."""

    def end(self) -> None: ...


class _NullSpan:
    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def end(self) -> None:
        return None


_NULL_SPAN = _NullSpan()
_NULL: AbstractContextManager[SpanLike] = contextlib.nullcontext(_NULL_SPAN)  # reusable and reentrant


class _Active:
    """The SDK's pieces while tracing is on (built only then, so "off" imports nothing)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("switchyard")
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}

    def start(
        self, name: str, *, kind: str, attrs: Mapping[str, Attr], headers: Mapping[str, str] | None
    ) -> AbstractContextManager[SpanLike]:
        parent = self.propagator.extract(carrier=dict(headers)) if headers is not None else None
        clean = {PREFIX + k: v for k, v in attrs.items() if v is not None}
        return self.tracer.start_as_current_span(
            name, context=parent, kind=self.kinds[kind], attributes=clean
        )

    def open(self, name: str, *, parent: SpanLike | None, attrs: Mapping[str, Attr]) -> OpenSpan:
        from opentelemetry import trace

        context = trace.set_span_in_context(parent) if parent is not None else None  # type: ignore[arg-type]
        clean = {PREFIX + k: v for k, v in attrs.items() if v is not None}
        opened: OpenSpan = self.tracer.start_span(name, context=context, attributes=clean)
        return opened


# The one process-wide switch, like logging's configuration: spans are opened deep inside request and job
# code that holds no Runtime, and OpenTelemetry's own context is process-wide (contextvars) as well.
_active: _Active | None = None


def enabled() -> bool:
    return _active is not None


def span(name: str, /, *, kind: str = "internal", **attrs: Attr) -> AbstractContextManager[SpanLike]:
    """A span named `name`, the child of the current one, with `attrs` as switchyard.* attributes (None
    values left out). `kind`: "internal", "client" (a call to an engine) or "server". An exception that
    leaves the block is recorded on the span and marks it failed. Off: a shared null context."""
    active = _active
    if active is None:
        return _NULL
    return active.start(name, kind=kind, attrs=attrs, headers=None)


def open_span(name: str, /, *, parent: SpanLike | None = None, **attrs: Attr) -> OpenSpan:
    """A span that stays open until its `end()`, for work moved by events rather than one block: the child
    of `parent` when given (a job's step under its job), else of the current span. It is not made current,
    so it may be ended from another task. Off: the null span (its end() does nothing)."""
    active = _active
    if active is None:
        return _NULL_SPAN
    return active.open(
        name, parent=parent if parent is not None and parent.is_recording() else None, attrs=attrs
    )


def server_span(
    name: str, /, *, headers: Mapping[str, str], **attrs: Attr
) -> AbstractContextManager[SpanLike]:
    """The span of one request to this server: it continues the trace of the client's `traceparent`
    header when there is a valid one, else it starts a trace."""
    active = _active
    if active is None:
        return _NULL
    carried = {k: v for k in ("traceparent", "tracestate") if (v := headers.get(k)) is not None}
    return active.start(name, kind="server", attrs=attrs, headers=carried)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to `headers` (nothing while off)."""
    active = _active
    if active is not None:
        active.propagator.inject(headers)


def fail(span_: SpanLike, description: str) -> None:
    """Mark `span_` failed (an answer that is an error without an exception: a 5xx, an error event)."""
    if not span_.is_recording():
        return
    from opentelemetry.trace import Status, StatusCode

    set_status = getattr(span_, "set_status", None)
    if set_status is not None:
        set_status(Status(StatusCode.ERROR, description[:300]))


def fail_current(description: str) -> None:
    """Mark the current span failed (a stream that ended in an error event); nothing while off."""
    if _active is None:
        return
    from opentelemetry import trace

    fail(trace.get_current_span(), description)


def otlp_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector's base URL (`http://host:4318` -> `.../v1/traces`)."""
    base = endpoint.rstrip("/")
    return base if base.endswith(OTLP_TRACES) else base + OTLP_TRACES


def check_endpoint(endpoint: str) -> str | None:
    """Why `endpoint` cannot be an OTLP/HTTP collector URL, or None when it can."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL of an OTLP/HTTP collector (port 4318), got {endpoint!r}"
    return None


def install(
    exporter: SpanExporter | None = None, *, endpoint: str | None = None, service: str = "switchyard"
) -> bool:
    """Turn tracing on: spans to `exporter` as each ends (a test's in-memory one) and, with `endpoint`, in
    batches to that OTLP/HTTP collector. False, with a log line naming what to install, when a package is
    missing; tracing then stays off."""
    global _active
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("tracing is asked for, but opentelemetry-sdk is not installed; %s", INSTALL_HINT)
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if endpoint is not None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning(
                "tracing_otlp_endpoint is set, but the OTLP exporter is not installed; %s", INSTALL_HINT
            )
            if exporter is None:
                return False
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_url(endpoint))))
            log.info("tracing: spans go to %s", otlp_url(endpoint))
    shutdown()
    _active = _Active(provider)
    return True


def shutdown() -> None:
    """Turn tracing off, flushing what the exporters still hold (a batch exporter posts it)."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.provider.shutdown()


@contextlib.asynccontextmanager
async def exporting(endpoint: str | None) -> AsyncIterator[bool]:
    """Tracing to `endpoint` for the life of a server (its cleanup context); nothing when None, and then
    an exporter a test installed is left alone. Yields whether this turned tracing on."""
    if endpoint is None or not install(endpoint=endpoint):
        yield False
        return
    try:
        yield True
    finally:
        await asyncio.to_thread(shutdown)  # the last batch is posted: never block the loop on a collector
