"""Jobs, update checks and webhooks in one in-process server (a real Runtime, the local test hub, a real
llama.cpp lane for the eval job): /api/jobs, its event stream, cancel, the per-repository guard, the
jobs kept after a restart, /api/updates against a new hub commit, and signed webhooks with retries."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.core.errors import SettingsError
from app.core.events import Event, EventBus
from app.core.jobs import JobRegistry
from app.core.notify import POLICY_REFUSED, SIGNATURE_HEADER, Message, Notifier, tray_message
from app.core.paths import Paths
from app.core.settings import Settings, settings_from_mapping
from app.runtime import Runtime
from app.server.app import make_app
from tests.support.fakehub import FakeHub

REPO = "org/jobs-GGUF"
MODEL = f"{REPO}/j-Q8_0"


async def _sse(client: TestClient, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event of a stream that ends by itself (a job's)."""
    out: list[tuple[str, dict[str, Any]]] = []
    async with client.get(path, timeout=60) as resp:
        assert resp.status == 200
        kind = ""
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                out.append((kind, json.loads(line[6:])))
    return out


async def _start(client: TestClient, body: dict[str, Any], status: int = 202) -> dict[str, Any]:
    r = await client.post("/api/jobs", json=body)
    doc = await r.json()
    assert r.status == status, doc
    return dict(doc)


async def test_jobs_updates_and_the_repository_guard(
    fake_hub: FakeHub, model_store: Path, tmp_path: Path
) -> None:
    fake_hub.add_repo(REPO, {"j-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()})
    home = tmp_path / "home"
    settings = Settings.flat(plan_memory=False, monitor_interval_s=0, models_dirs=(tmp_path / "none",))
    rt = Runtime(settings=settings, paths=Paths(home=home))
    async with TestClient(TestServer(make_app(rt))) as client:
        assert (await (await client.get("/api/jobs")).json()) == {"jobs": []}
        # a pull as a job: 202 at once, followed to its end over SSE
        job = (await _start(client, {"kind": "download", "repo": f"{REPO}:Q8_0"}))["job"]
        assert job["kind"] == "download" and job["title"] == f"pull {REPO}:Q8_0"
        events = await _sse(client, f"/api/jobs/{job['id']}/events")
        assert events[0][0] == "snapshot" and events[-1][0] == "job.completed", events
        listed = (await (await client.get("/api/jobs")).json())["jobs"]
        done = next(j for j in listed if j["id"] == job["id"])
        assert done["state"] == "completed" and done["steps"][-1]["name"] == "download"
        assert (await client.get("/api/jobs/job-nope")).status == 404
        r = await client.delete(f"/api/jobs/{job['id']}")
        assert r.status == 409 and (await r.json())["error"]["code"] == "job_not_cancellable"
        assert (await client.post("/api/jobs", json={"kind": "bake"})).status == 400
        await asyncio.to_thread(rt.catalog.scan)

        # the eval job: the model's real lane answers the pinned case
        suite = rt.paths.suites / "pinned.json"  # the one folder the server reads suites from
        suite.parent.mkdir()
        case = {"id": "sum", "prompt": "17+25?", "expect": {"number": 42}}
        case["params"] = {"grammar": 'root ::= "42"', "max_tokens": 4}
        suite.write_text(json.dumps({"name": "pinned", "cases": [case]}))
        ev_job = (await _start(client, {"kind": "eval", "model": MODEL, "suite": "pinned"}))["job"]
        ended = (await _sse(client, f"/api/jobs/{ev_job['id']}/events"))[-1]
        assert ended[0] == "job.completed" and ended[1]["result"]["score"] == 1.0, ended
        await rt.supervisor.unload(MODEL)

        # update checks: a commit that leaves the model's file alone is no update; a new file is, once
        seen: list[Event] = []

        async def watch() -> None:
            async with rt.bus.subscribe() as q:
                while True:
                    ev = await q.get()
                    if ev.kind == "model.update_available":
                        seen.append(ev)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        fake_hub.commit(REPO, {"README.md": b"# notes\n"})
        doc = await (await client.post("/api/updates/check")).json()
        (info,) = doc["updates"]
        assert info["model"] == MODEL and info["available"] is False and info["head"] != info["current"]
        head = fake_hub.commit(REPO, {"j-Q8_0.gguf": (model_store / "tiny2.gguf").read_bytes()})
        for _ in range(2):
            doc = await (await client.post("/api/updates/check")).json()
        (info,) = doc["updates"]
        assert info["available"] and info["changed"] == ["j-Q8_0.gguf"] and info["head"] == head
        assert (await (await client.get("/api/updates")).json())["updates"] == doc["updates"]
        await asyncio.sleep(0.05)
        assert [e.data["head"] for e in seen] == [head]  # published once for the new commit
        watcher.cancel()

        # one update of a repository at a time: a gated update while the plain one runs is a 409
        fake_hub.faults.rate_bps = 20_000
        up = (await _start(client, {"kind": "update", "repo": REPO}))["job"]
        assert up["kind"] == "update"
        gate = {"model": MODEL, "suite": "arithmetic", "min_score": 0.5}
        r = await client.post("/api/hub/gated-update", json=gate)
        err = (await r.json())["error"]
        assert r.status == 409 and err["code"] == "job_busy" and up["id"] in err["message"]
        r = await client.post("/api/jobs", json={"kind": "update", **gate})
        assert r.status == 409
        cancelled = await (await client.delete(f"/api/jobs/{up['id']}")).json()
        assert cancelled["state"] == "cancelled"
        fake_hub.faults.rate_bps = None

    # a restarted server lists the finished jobs
    async with JobRegistry(bus=EventBus(), state_file=home / "jobs.json") as jobs:
        kept = {j.id: j.state.value for j in jobs.all()}
    assert kept[job["id"]] == "completed" and kept[up["id"]] == "cancelled"


class Receiver:
    """A local webhook endpoint: records bodies and headers; answers 500 to the first `fail` posts."""

    def __init__(self, fail: int = 0) -> None:
        self.got: list[tuple[bytes, dict[str, str]]] = []
        self.fail = fail

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((await request.read(), dict(request.headers)))
        if self.fail > 0:
            self.fail -= 1
            return web.Response(status=500)
        return web.Response(text="ok")


async def test_webhooks_are_signed_retried_and_deduplicated() -> None:
    receiver = Receiver(fail=2)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    app.router.add_post("/slack", receiver.handle)
    async with TestServer(app) as server:
        base = f"http://127.0.0.1:{server.port}"
        config = {
            "webhooks": [
                # a receiver on this machine: allowed per hook only
                {"url": f"{base}/hook", "secret": "s3cret", "events": ["job.failed"], "allow_local": True},
                {
                    "url": f"{base}/slack",
                    "kind": "slack",
                    "events": ["requests.refused"],
                    "allow_local": True,
                },
            ],
            "refusals_per_hour": 3,
        }
        settings_from_mapping({"notify": config})  # a valid setting
        async with Notifier(config=lambda: config, backoff_s=0.01) as notifier:
            # a 404 or a bad body is the client's mistake, not a refusal: none of them counts
            for status in (404, 404, 404, 400, 422):
                notifier.observe(Event("request.done", {"status": status, "route": "/v1/x"}))
            failed = {"id": "job-1", "job_kind": "download", "title": "pull org/x", "error": "disk full"}
            notifier.observe(Event("job.failed", failed))
            notifier.observe(Event("job.failed", failed))  # the same (event, subject): once an hour
            notifier.observe(Event("job.completed", {**failed, "error": None}))  # no hook wants it
            for _ in range(200):  # one queue, one sender: what the 4xx answers queued would be out first
                if notifier.sent:
                    break
                await asyncio.sleep(0.02)
            assert [o["event"] for o in notifier.sent] == ["job.failed"], notifier.sent
            assert not [b for b, h in receiver.got if SIGNATURE_HEADER not in h]  # no refusal alert
            # the policy's refusals (as app/server/gateway/safety_gate.py publishes them) count
            refused = {"stage": "request", "model": "m", "judge": "guard", "verdict": "unsafe"}
            for stage in ("request", "answer", "request"):
                notifier.observe(Event(POLICY_REFUSED, {**refused, "stage": stage}))
            assert notifier.notify(Message("job.failed", "job-2", "x")) is True
            for _ in range(200):
                if len(notifier.sent) == 3:
                    break
                await asyncio.sleep(0.02)
            outcomes = notifier.sent
            assert [o["status"] for o in outcomes] == [200, 200, 200], outcomes
            assert outcomes[0]["attempts"] == 3  # two 500s, then delivered
            tested = await notifier.test()
            assert [t["ok"] for t in tested] == [True, True]
    signed = [(b, h) for b, h in receiver.got if SIGNATURE_HEADER in h]
    body, headers = signed[0]
    want = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == want
    doc = json.loads(body)
    assert doc["event"] == "job.failed" and "disk full" in doc["text"]
    slack = [json.loads(b) for b, h in receiver.got if SIGNATURE_HEADER not in h]
    assert any("3 requests refused" in s.get("text", "") for s in slack), slack


def test_the_tray_reports_job_ends_and_updates_only() -> None:
    said = tray_message("job.failed", {"title": "pull org/x", "error": "disk full"})
    assert said == ("Job failed", "pull org/x: disk full", True)
    assert tray_message("model.update_available", {"model": "org/x/m"}) == (
        "Update available",
        "org/x/m: a newer revision is on the hub",
        False,
    )
    assert tray_message("job.progress", {"title": "pull org/x"}) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"webhooks": [{"url": "ftp://x"}]},
        {"webhooks": [{"url": "http://x", "kind": "teams"}]},
        {"webhooks": [{"url": "http://x", "events": ["lunch"]}]},
        {"refusals_per_hour": 0},
        {"hooks": []},
    ],
)
def test_bad_notify_settings_say_what_is_wrong(bad: dict[str, Any]) -> None:
    with pytest.raises(SettingsError, match="notify"):
        settings_from_mapping({"notify": bad})
    with pytest.raises(SettingsError, match="update_check_h"):
        settings_from_mapping({"update_check_h": -1})
