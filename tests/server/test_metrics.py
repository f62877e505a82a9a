"""GET /metrics: Prometheus text from a real `switchyard serve` with real lanes, after real requests."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app
from app.server.metrics import usage_from
from tests.conftest import REPO, ServerProcess, link_models, wait_gone

GRAMMAR = 'root ::= "the answer is 42"'
FAIL_KEYRING = "keyring.backends.fail.Keyring"
CHAT = "/v1/chat/completions"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, labels), and each family's TYPE; checks HELP/TYPE come before the samples."""
    samples: Samples = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types and family in helped, f"{name} has no TYPE/HELP before it"
        pairs = frozenset(_LABEL.findall(labels or ""))
        assert (name, pairs) not in samples, f"duplicate series {line!r}"
        samples[(name, pairs)] = float(value)
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(server: ServerProcess) -> tuple[Samples, dict[str, str], str]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        ctype = r.headers["Content-Type"]
        samples, types = parse(r.read().decode())
    return samples, types, ctype


def post(server: ServerProcess, path: str, body: bytes, **headers: str) -> int:
    req = urllib.request.Request(
        server.url + path, data=body, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, model_store: Path
) -> Iterator[tuple[ServerProcess, str]]:
    base = tmp_path_factory.mktemp("metrics")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    home = base / "home"
    home.mkdir()
    env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHON_KEYRING_BACKEND=FAIL_KEYRING)
    made = subprocess.run(
        [sys.executable, "-m", "app", "keys", "create", "editor"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1].strip()
    with pytest.MonkeyPatch.context() as mp:  # module fixtures run before the autouse isolation
        mp.setenv("PYTHON_KEYRING_BACKEND", FAIL_KEYRING)
        s = ServerProcess(home, models).wait_ready()
    yield s, key
    pids = s.engine_pids()
    s.stop()
    wait_gone(pids, 5)


def test_requests_tokens_durations_and_errors_are_counted(server: tuple[ServerProcess, str]) -> None:
    s, _ = server
    c = openai.OpenAI(base_url=s.api, api_key="unused", max_retries=0, timeout=60)
    ask = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "what is it?"}],
        "max_tokens": 32,
        "temperature": 0,
        "extra_body": {"grammar": GRAMMAR},
    }
    whole = c.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert whole.usage is not None
    with_usage = list(c.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    final = with_usage[-1].usage
    assert final is not None and final.prompt_tokens == whole.usage.prompt_tokens
    # no include_usage: the count comes from llama.cpp's `timings` in the last chunk
    plain = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(**ask, stream=True)
        if ch.choices
    )  # type: ignore[call-overload]
    assert plain == "the answer is 42"
    done = c.completions.create(model="tiny", prompt="Once", max_tokens=8, extra_body={"grammar": GRAMMAR})
    emb = c.embeddings.create(model="embed", input=["hello", "world"], encoding_format="float")
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert post(s, CHAT, b"{not json") == 400

    ok = {"route": CHAT, "method": "POST", "model": "tiny", "status": "200", "client": "-"}
    # a stream is recorded when the server finishes it, which can be just after the client has read it all
    deadline = time.monotonic() + 20
    samples, types, ctype = scrape(s)
    while value(samples, "switchyard_requests_total", **ok) != 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        samples, types, ctype = scrape(s)
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    assert value(samples, "switchyard_requests_total", **ok) == 3
    emb_ok = {**ok, "route": "/v1/embeddings", "model": "embed"}
    assert value(samples, "switchyard_requests_total", **emb_ok) == 1
    assert value(samples, "switchyard_requests_total", **{**ok, "model": "-", "status": "404"}) == 1
    # an unknown model name is never a label
    assert not [k for k in samples if ("model", "gpt-9") in k[1]]
    err = {"route": CHAT, "model": "-", "client": "-"}
    assert value(samples, "switchyard_errors_total", **err, status="404", code="model_not_found") == 1
    assert value(samples, "switchyard_errors_total", **err, status="400", code="malformed_json") == 1
    assert not [k for k in samples if k[0] == "switchyard_errors_total" and ("status", "200") in k[1]]

    tokens = {"model": "tiny", "client": "-"}
    assert done.usage is not None and emb.usage is not None
    u = whole.usage
    assert (
        value(samples, "switchyard_input_tokens_total", **tokens)
        == 3 * u.prompt_tokens + done.usage.prompt_tokens
    )
    out = 3 * u.completion_tokens + done.usage.completion_tokens
    assert value(samples, "switchyard_output_tokens_total", **tokens) == out
    etok = {"model": "embed", "client": "-"}
    assert value(samples, "switchyard_input_tokens_total", **etok) == emb.usage.prompt_tokens
    assert value(samples, "switchyard_output_tokens_total", **etok) == 0

    assert types["switchyard_request_duration_seconds"] == "histogram"
    hist = {"route": CHAT, "model": "tiny"}
    assert value(samples, "switchyard_request_duration_seconds_count", **hist) == 3
    assert value(samples, "switchyard_time_to_first_byte_seconds_count", **hist) == 2  # the two streams
    ttfb = value(samples, "switchyard_time_to_first_byte_seconds_sum", **hist)
    assert 0 < ttfb <= value(samples, "switchyard_request_duration_seconds_sum", **hist)
    assert (
        value(samples, "switchyard_time_to_first_byte_seconds_count", route="/v1/embeddings", model="embed")
        == 0
    )


def test_histogram_buckets_are_cumulative_and_end_at_the_count(server: tuple[ServerProcess, str]) -> None:
    s, _ = server
    post(s, CHAT, b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}')
    assert post(s, "/v1/nothing/../at/all", b"{}") == 404
    samples, types, _ = scrape(s)
    unmatched = {"route": "-", "method": "POST", "model": "-", "status": "404", "client": "-"}
    assert value(samples, "switchyard_requests_total", **unmatched) == 1  # never the raw path
    for (name, labels), count in samples.items():
        if not name.endswith("_count") or "duration" not in name:
            continue
        base = name.removesuffix("_count")
        buckets = sorted(
            (float(dict(k[1])["le"]), v)
            for k, v in samples.items()
            if k[0] == base + "_bucket" and k[1] - {("le", dict(k[1])["le"])} == labels
        )
        assert buckets[-1] == (float("inf"), count)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert types["switchyard_download_bytes_total"] == "counter"
    assert not [k for k in samples if k[0] == "switchyard_download_bytes_total"]  # nothing downloaded
    assert value(samples, "switchyard_requests_in_flight") == 1  # this scrape


def test_client_label_is_the_key_name(server: tuple[ServerProcess, str]) -> None:
    s, key = server
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert post(s, CHAT, body.encode(), Authorization=f"Bearer {key}") == 200
    samples, _, _ = scrape(s)
    labels = {"route": CHAT, "method": "POST", "model": "tiny", "status": "200", "client": "editor"}
    assert value(samples, "switchyard_requests_total", **labels) == 1
    assert value(samples, "switchyard_input_tokens_total", model="tiny", client="editor") > 0
    assert key not in json.dumps([sorted(k[1]) for k in samples])


def lanes(s: ServerProcess) -> dict[str, dict]:  # type: ignore[type-arg]
    with urllib.request.urlopen(s.url + "/api/lanes", timeout=30) as r:
        return {ln["id"]: ln for ln in json.loads(r.read())["lanes"]}


def test_lane_state_and_restarts_are_read_at_scrape_time(server: tuple[ServerProcess, str]) -> None:
    s, _ = server
    assert post(s, "/api/models/tiny/load", b"") == 200
    samples, _, _ = scrape(s)
    assert value(samples, "switchyard_lane_state", model="tiny", state="ready") == 1
    assert (
        sum(value(samples, "switchyard_lane_state", model="tiny", state=st) for st in ("stopped", "failed"))
        == 0
    )
    before = value(samples, "switchyard_lane_restarts_total", model="tiny")
    os.kill(lanes(s)["tiny"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while lanes(s)["tiny"]["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.05)
    samples, _, _ = scrape(s)
    assert value(samples, "switchyard_lane_state", model="tiny", state="failed") == 1
    assert value(samples, "switchyard_lane_state", model="tiny", state="ready") == 0
    assert post(s, "/api/models/tiny/load", b"") == 200  # started again straight from failed
    samples, _, _ = scrape(s)
    assert value(samples, "switchyard_lane_restarts_total", model="tiny") == before + 1
    assert value(samples, "switchyard_lane_state", model="tiny", state="ready") == 1
    assert value(samples, "switchyard_lane_in_flight", model="tiny") == 0


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            b'{"id":"x","usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10},"timings":{}}',
            (7, 3),
        ),
        (b'{"object":"list","usage":{"prompt_tokens":4,"total_tokens":4}}', (4, 0)),
        (
            b'data: {"choices":[],"timings":{"cache_n":50,"prompt_n":4,"predicted_n":9}}\n\ndata: [DONE]\n\n',
            (54, 9),
        ),
        (b'data: {"choices":[{"delta":{"content":"\\"usage\\": 5"}}]}\n\n', None),
        (b"data: [DONE]\n\n", None),
        (b'{"usage": {"prompt_tokens": 2, "completion_tokens": 1}', (2, 1)),
        (b'{"usage": {"prompt_tok', None),
    ],
)
def test_usage_is_found_in_the_last_bytes(data: bytes, expected: tuple[int, int] | None) -> None:
    assert usage_from(data) == expected


# ---- download bytes, from the runtime's event bus ------------------------------------------------
async def test_download_bytes_are_summed_from_progress_events(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "home")
    )
    async with TestClient(TestServer(make_app(rt))) as client:
        publish = rt.bus.publish
        publish("download.progress", repo="org/model-GGUF", file="m.gguf", delta=1000, done=1000, total=9000)
        publish("download.progress", repo="org/model-GGUF", file="m.gguf", delta=4000, done=5000, total=9000)
        publish("download.progress", repo="other/embed", file="e.gguf", delta=7)
        publish("download.completed", repo="org/model-GGUF", delta=999)  # not a progress event
        publish("download.progress", repo="org/model-GGUF", delta="12")  # not a byte count
        publish("download.progress", repo="org/model-GGUF", delta=True)
        publish("download.progress", repo="org/model-GGUF", delta=-5)
        publish("download.progress", repo="other/embed", delta=3)  # the last: all before it are counted
        deadline = time.monotonic() + 10
        while True:
            r = await client.get("/metrics")
            samples, types = parse(await r.text())
            if value(samples, "switchyard_download_bytes_total", repo="other/embed") == 10:
                break
            assert time.monotonic() < deadline, "the progress events were not counted"
            await asyncio.sleep(0.05)
        assert types["switchyard_download_bytes_total"] == "counter"
        assert value(samples, "switchyard_download_bytes_total", repo="org/model-GGUF") == 5000
        publish("download.progress", repo="org/model-GGUF", delta=1)
        for _ in range(200):
            samples, _ = parse(await (await client.get("/metrics")).text())
            if value(samples, "switchyard_download_bytes_total", repo="org/model-GGUF") == 5001:
                break
            await asyncio.sleep(0.05)
        assert value(samples, "switchyard_download_bytes_total", repo="org/model-GGUF") == 5001


async def test_event_stream_carries_request_and_download_events(tmp_path: Path) -> None:
    """/api/events: a snapshot first, then each answered request (route pattern, status, client, model,
    never the raw path) and the download manager's events."""
    from aiohttp.test_utils import TestClient, TestServer

    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "home")
    )
    async with TestClient(TestServer(make_app(rt))) as client:
        events = await client.get("/api/events")
        seen: list[tuple[str, dict[str, Any]]] = []

        async def read_until(kind: str) -> dict[str, Any]:
            name = ""
            async with asyncio.timeout(10):
                while True:
                    line = (await events.content.readline()).decode().strip()
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        seen.append((name, json.loads(line.removeprefix("data: "))))
                        if name == kind:
                            return seen[-1][1]

        await read_until("snapshot")
        assert (await client.get("/v1/models")).status == 200
        assert (await client.get("/v1/models/nope%2F..%2Fsecret")).status == 404
        await client.get("/metrics")  # a scrape is not an event: a monitor polling it would flood the stream
        done = await read_until("request.done")
        assert {k: done[k] for k in ("route", "method", "status", "client", "model")} == {
            "route": "/v1/models",
            "method": "GET",
            "status": 200,
            "client": "-",
            "model": "-",
        }
        assert done["seconds"] >= 0
        missing = await read_until("request.done")
        assert missing["route"] == "/v1/models/{model_id}" and missing["status"] == 404
        assert "secret" not in json.dumps(missing)
        rt.bus.publish("download.progress", repo="org/m", delta=5)
        progress = await read_until("download.progress")
        assert progress["repo"] == "org/m" and progress["delta"] == 5
        assert not [d for k, d in seen if k == "request.done" and d["route"] == "/metrics"]
        events.close()


def test_anthropic_and_ollama_tokens_are_counted(server: tuple[ServerProcess, str]) -> None:
    import anthropic
    import ollama

    s, _ = server
    tokens = {"model": "tiny", "client": "-"}

    def counts() -> tuple[float, float]:
        samples, _, _ = scrape(s)
        return (
            value(samples, "switchyard_input_tokens_total", **tokens),
            value(samples, "switchyard_output_tokens_total", **tokens),
        )

    before = counts()
    a = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    msg = a.messages.create(model="tiny", max_tokens=6, messages=hi)  # type: ignore[arg-type]
    with a.messages.stream(model="tiny", max_tokens=5, messages=hi) as st:  # type: ignore[arg-type]
        streamed = st.get_final_message()
    o = ollama.Client(host=s.url)
    chat = o.chat(model="tiny", messages=hi, options={"num_predict": 4})
    want_in = msg.usage.input_tokens + streamed.usage.input_tokens + (chat.prompt_eval_count or 0)
    want_out = msg.usage.output_tokens + streamed.usage.output_tokens + (chat.eval_count or 0)
    assert want_in > 0 and want_out > 0
    deadline = time.monotonic() + 20  # a stream is recorded when the server has finished it
    got = counts()
    while (got[0] - before[0], got[1] - before[1]) != (want_in, want_out) and time.monotonic() < deadline:
        time.sleep(0.05)
        got = counts()
    assert (got[0] - before[0], got[1] - before[1]) == (want_in, want_out)
