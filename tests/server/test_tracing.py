"""Traces (docs/tracing.md): the spans of real requests through an in-process server, read from the SDK's
InMemorySpanExporter. A tiny llama.cpp lane gives the span tree (server -> resolve, wait for the lane,
engine call, stream) with its attributes, continuing the client's traceparent; a small aiohttp stand-in,
registered as a remote, shows the traceparent going on to a remote lane; a tiny judge model (its verdict
pinned by a grammar) gives the judge's span; a real eval job (POST /api/jobs) gives the job and job-step
spans; a subprocess shows that with tracing off nothing of opentelemetry is imported; a stand-in collector
receives the OTLP/HTTP export of a job's spans."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.core import tracing
from app.core.errors import SettingsError
from app.core.events import EventBus
from app.core.jobs import JobHandle, JobKind, JobRegistry
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app
from tests.conftest import REPO, link_models

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
GRAMMAR = 'root ::= "the answer is 42"'
CHAT = "/v1/chat/completions"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.install(exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


@pytest.fixture
async def client(tmp_path: Path, model_store: Path) -> AsyncIterator[TestClient[Any, Any]]:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    settings = Settings.flat(
        models_dirs=(models,), plan_memory=False, monitor_interval_s=0, runtime="xllamacpp"
    )
    rt = Runtime(settings=settings, paths=Paths(home=tmp_path / "home"))
    async with TestClient(TestServer(make_app(rt))) as c:
        yield c


def _named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def _children(found: list[ReadableSpan], parent: ReadableSpan) -> list[str]:
    return [s.name for s in found if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_a_request_to_a_local_lane_gives_the_span_tree(
    spans: InMemorySpanExporter, client: TestClient[Any, Any]
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "grammar": GRAMMAR}
    r = await client.post(CHAT, json=body, headers={"traceparent": TRACEPARENT})
    assert r.status == 200 and "42" in (await r.json())["choices"][0]["message"]["content"]
    found = list(spans.get_finished_spans())
    (server,) = _named(found, "POST /v1/chat/completions")
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == TRACE  # the client's trace goes on
    assert server.parent is not None and f"{server.parent.span_id:016x}" == PARENT
    attrs = dict(server.attributes or {})
    assert attrs["http.response.status_code"] == 200 and attrs["switchyard.model"] == "tiny"
    assert attrs["http.route"] == CHAT
    kids = _children(found, server)
    assert kids[:2] == ["switchyard.resolve", "switchyard.wait_lane"] and "switchyard.engine" in kids
    (wait,) = _named(found, "switchyard.wait_lane")
    assert dict(wait.attributes or {})["switchyard.lane"] == "llama.cpp"
    (engine,) = _named(found, "switchyard.engine")
    e_attrs = dict(engine.attributes or {})
    assert engine.kind is SpanKind.CLIENT and e_attrs["switchyard.lane"] == "llama.cpp"
    assert e_attrs["switchyard.model"] == "tiny" and e_attrs["http.response.status_code"] == 200
    assert all(s.context.trace_id == server.context.trace_id for s in found if s.name != "GET /health")

    # a stream: its own span under the server span; no traceparent starts a new trace
    spans.clear()
    r = await client.post(CHAT, json={**body, "stream": True})
    assert r.status == 200 and b"[DONE]" in await r.read()
    found = list(spans.get_finished_spans())
    (server,) = _named(found, "POST /v1/chat/completions")
    assert server.parent is None and f"{server.context.trace_id:032x}" != TRACE
    assert {"switchyard.engine", "switchyard.stream"} <= set(_children(found, server))

    # a refusal is a span too, marked failed for a 5xx only
    spans.clear()
    r = await client.post(CHAT, json={**body, "model": "nope"})
    assert r.status == 404
    (server,) = _named(spans.get_finished_spans(), "POST /v1/chat/completions")
    assert dict(server.attributes or {})["http.response.status_code"] == 404
    assert server.status.status_code is not StatusCode.ERROR


async def test_traceparent_is_passed_to_a_remote_lane(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        return web.json_response({"id": "x", "object": "chat.completion", **answer})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "far-model", "object": "model"}]})

    stand_in = web.Application()
    stand_in.router.add_get("/v1/models", models)
    stand_in.router.add_post("/v1/chat/completions", chat)
    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "home")
    )
    async with TestServer(stand_in) as far, TestClient(TestServer(make_app(rt))) as c:
        r = await c.post("/api/remotes", json={"name": "far", "url": str(far.make_url("/v1"))})
        assert r.status in (200, 201) and (await r.json())["state"] == "ready"
        body = {"model": "far/far-model", "messages": [{"role": "user", "content": "hi"}]}
        r = await c.post(CHAT, json=body, headers={"traceparent": TRACEPARENT})
        assert r.status == 200, await r.text()
    assert seen and seen[-1] is not None
    version, trace, parent, flags = seen[-1].split("-")
    assert (version, trace, flags) == ("00", TRACE, "01")
    (engine,) = _named(spans.get_finished_spans(), "switchyard.engine")
    assert parent == f"{engine.context.span_id:016x}"  # the remote's parent is our engine call
    assert dict(engine.attributes or {})["switchyard.lane"] == "remote"


UNSAFE = 'root ::= "Safety: Unsafe\\nCategories: Violent"'


async def test_the_judge_is_a_span_with_its_verdict_and_never_the_text(
    spans: InMemorySpanExporter, tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    judge = {"model": "tiny2", "format": "qwen3guard", "timeout_s": 60, "grammar": UNSAFE}
    settings = Settings.flat(
        models_dirs=(models,),
        plan_memory=False,
        monitor_interval_s=0,
        runtime="xllamacpp",
        max_loaded_lanes=3,
        model_overrides={"tiny2": {"parallel": 1, "ctx_size": 2048}},
        policy={"enabled": True, "judges": [judge]},
    )
    rt = Runtime(settings=settings, paths=Paths(home=tmp_path / "home"))
    secret = "SECRETSTART " + "y" * 3000 + " SECRETEND"  # longer than the judge's slot: start and end
    async with TestClient(TestServer(make_app(rt))) as c:
        body = {"model": "tiny", "messages": [{"role": "user", "content": secret}], "max_tokens": 2}
        r = await c.post(CHAT, json=body, headers={"traceparent": TRACEPARENT})
        doc = await r.json()
        assert r.status == 400 and doc["error"]["code"] == "content_policy_violation", doc
    found = list(spans.get_finished_spans())
    (server,) = _named(found, "POST /v1/chat/completions")
    (judged,) = _named(found, "switchyard.judge")
    assert judged.parent is not None and judged.parent.span_id == server.context.span_id
    attrs = dict(judged.attributes or {})
    assert (attrs["switchyard.judge"], attrs["switchyard.format"], attrs["switchyard.stage"]) == (
        "tiny2",
        "qwen3guard",
        "request",
    )
    assert attrs["switchyard.verdict"] == "unsafe" and attrs["switchyard.blocked"] is True
    assert tuple(attrs["switchyard.categories"]) == ("violence",)  # type: ignore[arg-type]
    assert float(attrs["switchyard.latency_ms"]) > 0  # type: ignore[arg-type]
    assert attrs["switchyard.text_bytes"] == len(secret) > attrs["switchyard.read_bytes"]  # type: ignore[operator]
    # the judge's own request to its lane is traced under it; the text is in no span of the trace
    assert "switchyard.engine" in _children(found, judged)
    for s in found:
        for value in dict(s.attributes or {}).values():
            assert "SECRET" not in str(value), (s.name, value)
    assert "switchyard.engine" not in [n for n in _children(found, server)]  # refused before the engine


async def test_a_job_and_its_steps_are_spans(
    spans: InMemorySpanExporter, client: TestClient[Any, Any], tmp_path: Path
) -> None:
    case = {"id": "sum", "prompt": "17+25?", "expect": {"number": 42}}
    case["params"] = {"grammar": 'root ::= "42"', "max_tokens": 4}
    suite = json.dumps({"name": "pinned", "cases": [case, {**case, "id": "sum2"}]})
    # a suite from outside the suites folder is sent as its text (the server reads files only from there)
    body = {"kind": "eval", "model": "tiny", "suite": "pinned.json", "suite_text": suite}
    r = await client.post("/api/jobs", json=body)
    assert r.status == 202, await r.text()
    job = (await r.json())["job"]
    for _ in range(600):
        state = (await (await client.get(f"/api/jobs/{job['id']}")).json())["state"]
        if state not in ("queued", "running"):
            break
        await asyncio.sleep(0.1)
    assert state == "completed"
    found = list(spans.get_finished_spans())
    (job_span,) = [s for s in _named(found, "switchyard.job") if s.attributes["switchyard.job"] == job["id"]]  # type: ignore[index]
    j_attrs = dict(job_span.attributes or {})
    assert (j_attrs["switchyard.job_kind"], j_attrs["switchyard.state"]) == ("eval", "completed")
    steps = _named(found, "switchyard.job_step")
    (step,) = [s for s in steps if s.parent is not None and s.parent.span_id == job_span.context.span_id]
    s_attrs = dict(step.attributes or {})
    assert (s_attrs["switchyard.job_kind"], s_attrs["switchyard.step"]) == ("eval", "eval")
    assert (s_attrs["switchyard.done"], s_attrs["switchyard.total"]) == (2, 2)
    assert job_span.start_time <= step.start_time and step.end_time <= job_span.end_time  # type: ignore[operator]
    # the cases' requests went through the gateway: their server spans are in the exporter too
    assert len(_named(found, "POST /v1/chat/completions")) >= 2


_OFF = """
import asyncio, sys
from pathlib import Path
from aiohttp.test_utils import TestClient, TestServer
from app.core import tracing
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app

async def main():
    settings = Settings.flat(plan_memory=False, monitor_interval_s=0)
    rt = Runtime(settings=settings, paths=Paths(home=Path(sys.argv[1])))
    async with TestClient(TestServer(make_app(rt))) as c:
        assert (await c.get("/health")).status == 200
    with tracing.span("x", model="m") as s:
        s.set_attribute("k", 1)
    tracing.inject({})

asyncio.run(main())
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""


def test_tracing_off_imports_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + _OFF, str(tmp_path / "home")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


async def test_spans_are_exported_over_otlp_http(tmp_path: Path) -> None:
    posted: list[tuple[str, bytes]] = []

    async def traces(request: web.Request) -> web.Response:
        posted.append((request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    collector = web.Application()
    collector.router.add_post("/v1/traces", traces)
    async with TestServer(collector) as srv:
        endpoint = str(srv.make_url("/")).rstrip("/")
        async with tracing.exporting(endpoint) as on:
            assert on and tracing.enabled()

            async def work(handle: JobHandle) -> dict[str, Any]:  # a job of the registry, step by step
                handle.step("fetch", done=1, total=2)
                handle.step("fetch", done=2, total=2)
                handle.step("check")
                return {}

            async with JobRegistry(bus=EventBus(), state_file=tmp_path / "jobs.json") as jobs:
                job = jobs.run(JobKind.EVAL, "traced job", work)
                assert (await jobs.wait(job.id)).state.value == "completed"
        assert not tracing.enabled()  # leaving it flushed the batch and turned tracing off
    assert posted and posted[0][0] == "application/x-protobuf"
    sent = b"".join(body for _, body in posted)
    for name in (b"switchyard.job", b"switchyard.job_step", b"fetch", b"check", job.id.encode()):
        assert name in sent, name
    async with tracing.exporting(None) as on:
        assert not on and not tracing.enabled()


def test_the_endpoint_setting_is_checked() -> None:
    assert Settings.flat(tracing_otlp_endpoint="http://127.0.0.1:4318").server.tracing_otlp_endpoint
    with pytest.raises(SettingsError, match="tracing_otlp_endpoint must be an http"):
        Settings.flat(tracing_otlp_endpoint="127.0.0.1:4318")
    assert tracing.otlp_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing.otlp_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
