"""The mistral.rs lane for real: the `mistralrs` Runner in our worker, through a real `switchyard serve`, with
the official openai client, on two generated models: the tiny llama GGUF (tests/support/tinymodels.py),
pinned to
mistral.rs while a copy of it stays on llama.cpp, and a plain safetensors llama folder
(tests/support/mlxgen.py),
which only mistral.rs can run on a machine without an NVIDIA GPU.

Random weights emit arbitrary text, so answers are pinned with mistral.rs's own grammar field (a Lark
grammar) or checked for their structure: ids, roles, finish reasons, usage and the order of stream events.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.lanes.engines.mistralrs import MISTRALRS
from app.lanes.engines.plan import StartContext
from app.library.model import ModelEntry
from tests.conftest import REPO, ServerProcess, link_models, running_server, wait_gone
from tests.support.mlxgen import DIMS, write_hf_llama
from tests.support.modelgen import llama_tensors, write_hf_dir

pytest.importorskip("mistralrs")
pytest.importorskip("tokenizers")

PINNED = "mrs"  # the tiny GGUF, pinned to mistral.rs
DEFAULT = "tiny"  # the same GGUF format, left to routing: llama.cpp
PLAIN = "org/plain-llama"  # a plain safetensors folder
ANSWER = "the answer is 42"
GRAMMAR = {"grammar": {"type": "lark", "value": f'start: "{ANSWER}"'}}


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SWITCHYARD_HOME": str(home),
        "HOME": str(home),
        "SWITCHYARD_NO_STARTER": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("mistralrs")
    models = link_models(base / "models", model_store / "tiny.gguf")
    (models / f"{PINNED}.gguf").hardlink_to(models / "tiny.gguf")
    write_hf_llama(models / PLAIN)
    pinned = cli(base / "home", "pin", PINNED, "mistral.rs", "--models-dir", str(models))
    assert pinned.returncode == 0, pinned.stderr  # `switchyard pin` accepts it: mistral.rs reads GGUF
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def lanes(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {ln["model"]: ln for ln in get(server.url + "/api/lanes")["lanes"]}


def ask(client: openai.OpenAI, model: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], **kw)


def test_pinned_gguf_runs_on_mistralrs_and_the_same_format_stays_on_llamacpp(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    r = ask(client, PINNED, max_tokens=20, extra_body=GRAMMAR)
    assert r.choices[0].message.content == ANSWER and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "stop" and r.model == PINNED and r.id.startswith("chatcmpl-")
    u = r.usage
    assert u is not None and u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    lane = lanes(server)[PINNED]
    assert (lane["engine"], lane["runtime"], lane["state"]) == ("mistral.rs", "mistralrs", "ready")
    assert lane["params"]["source"] == "gguf" and lane["params"]["files"] == [f"{PINNED}.gguf"]
    # runtime-managed: no made-up prediction, the footprint as measured once loaded
    assert lane["predicted"] is None and lane["measured"]["rss_bytes"] > 10 << 20
    worker = lane["pid"]

    d = ask(client, DEFAULT, max_tokens=2)
    assert d.choices[0].message.content is not None and d.model == DEFAULT
    now = lanes(server)
    assert now[DEFAULT]["engine"] == "llama.cpp" and now[DEFAULT]["state"] == "ready"
    # one generation lane at a time: the swap stopped the mistral.rs worker, and nothing of it is left
    assert now[PINNED]["state"] == "stopped" and wait_gone([worker], 10) == []


def test_streamed_chat_sends_role_content_finish_and_usage_events(client: openai.OpenAI) -> None:
    chunks = list(
        ask(
            client,
            PINNED,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=GRAMMAR,
        )
    )
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER and sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])
    last = chunks[-1]  # OpenAI's usage-only event, asked for with include_usage
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0
    # without include_usage, the usage rides on the finishing event (as llama.cpp sends it)
    plain = list(ask(client, PINNED, max_tokens=3, stream=True, extra_body={"ignore_eos": True}))
    assert plain[-1].choices[0].finish_reason == "length"
    assert plain[-1].usage is not None and plain[-1].usage.completion_tokens == 3


def test_completions_whole_and_streamed(client: openai.OpenAI) -> None:
    c = client.completions.create(model=PINNED, prompt="the", max_tokens=4, extra_body={"ignore_eos": True})
    assert c.id.startswith("cmpl-") and c.object == "text_completion" and c.model == PINNED
    assert c.choices[0].finish_reason == "length" and isinstance(c.choices[0].text, str)
    assert c.usage is not None and c.usage.completion_tokens == 4 and c.usage.prompt_tokens > 0
    g = client.completions.create(model=PINNED, prompt="q:", max_tokens=20, extra_body=GRAMMAR)
    assert g.choices[0].text == ANSWER and g.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(model=PINNED, prompt="q:", max_tokens=20, stream=True, extra_body=GRAMMAR)
    )
    assert "".join(ch.choices[0].text for ch in chunks) == ANSWER
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is not None


def test_plain_safetensors_folder_runs_on_mistralrs(client: openai.OpenAI, server: ServerProcess) -> None:
    decision = get(server.url + f"/api/models/{PLAIN}/explain")["decision"]
    assert decision["lane"] == "mistral.rs"  # no NVIDIA GPU, not Apple Silicon: the only lane that can
    r = client.chat.completions.create(
        model=PLAIN,
        messages=[{"role": "user", "content": "w3 w4"}],
        max_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 3
    assert r.model == PLAIN and isinstance(r.choices[0].message.content, str)
    events = list(
        client.chat.completions.create(
            model=PLAIN,
            messages=[{"role": "user", "content": "w5"}],
            max_tokens=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert events[0].choices[0].delta.role == "assistant" and events[-1].choices[0].finish_reason == "length"
    c = client.completions.create(model=PLAIN, prompt="w7 w8", max_tokens=2, extra_body={"ignore_eos": True})
    assert c.usage is not None and c.usage.completion_tokens == 2
    lane = lanes(server)[PLAIN]
    assert lane["engine"] == "mistral.rs" and lane["params"]["source"] == "plain"


def test_bad_requests_get_clean_errors(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        ask(client, PINNED, extra_body={"grammar": 'root ::= "x"'})  # llama.cpp's GBNF
    assert "does not read GBNF" in str(exc.value)
    with pytest.raises(openai.BadRequestError, match="tool calling is not available"):
        ask(client, PINNED, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=PINNED, messages=[{"role": "user", "content": "hi " * 3000}], max_tokens=2
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "context_length_exceeded"
    assert "2048" in str(exc.value)  # the model's context, as mistral.rs reports it
    # the worker's own answer to a body that is not JSON (the gateway would answer it first)
    port = lanes(server)[PINNED]["port"]
    bad = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        content=b'{"messages": [',
        headers={"Content-Type": "application/json"},
    )
    err = bad.json()["error"]
    assert (
        bad.status_code == 400
        and "not valid JSON" in err["message"]
        and err["type"] == "invalid_request_error"
    )
    assert lanes(server)[PINNED]["state"] == "ready"  # refusals leave the engine serving
    assert ask(client, PINNED, max_tokens=20, extra_body=GRAMMAR).choices[0].message.content == ANSWER


def test_client_hangup_stops_generation(client: openai.OpenAI, server: ServerProcess) -> None:
    ask(client, PINNED, max_tokens=1)  # the lane is up
    worker = psutil.Process(lanes(server)[PINNED]["pid"])
    body = {
        "model": PINNED,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4000,  # tens of seconds of work, were it left running
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.api + "/chat/completions", json=body, timeout=60) as r:
        got = [line for _, line in zip(range(6), r.iter_lines(), strict=False)]
    assert sum(line.startswith("data: {") for line in got) >= 3  # it was generating
    time.sleep(0.5)
    before = sum(worker.cpu_times()[:2])
    time.sleep(2.0)
    # generating takes about a core (seconds of CPU here); an idle worker uses next to none
    assert sum(worker.cpu_times()[:2]) - before < 0.15


def test_explain_and_doctor_name_the_lane(server: ServerProcess) -> None:
    pinned = get(server.url + f"/api/models/{PINNED}/explain")["decision"]
    assert pinned["lane"] == "mistral.rs" and pinned["pinned"] is True
    assert "You pinned this model to mistral.rs." in pinned["reasons"]
    llama = {r["lane"]: r for r in pinned["rejections"]}["llama.cpp"]
    assert llama["kind"] == "pinned_elsewhere"
    default = get(server.url + f"/api/models/{DEFAULT}/explain")["decision"]
    assert default["lane"] == "llama.cpp" and default["pinned"] is False
    mrs = {r["lane"]: r for r in default["rejections"]}["mistral.rs"]
    assert mrs["kind"] == "lower_preference" and f"switchyard pin {DEFAULT} mistral.rs" in mrs["message"]
    # the CLI's text, after a load on mistral.rs was recorded: no llama.cpp numbers passed off as its own
    out = cli(server.home, "explain", PINNED, "--local", "--models-dir", str(server.models_dir))
    assert out.returncode == 0, out.stderr
    assert "lane:   mistral.rs (pinned)" in out.stdout
    assert "memory: mistral.rs sizes its own KV cache" in out.stdout
    out = cli(server.home, "doctor", "--json")
    assert out.returncode == 0, out.stderr
    row = {ln["lane"]: ln for ln in json.loads(out.stdout)["lanes"]}["mistral.rs"]
    assert row["installed"] and row["has_lane"] and row["can_start"] and "mistralrs" in row["version"]
    assert row["capabilities"] == ["chat", "completions"] and row["formats"] == ["gguf", "safetensors"]
    assert row["memory"] == "runtime-managed"


def test_anthropic_and_ollama_surfaces_reach_the_lane(server: ServerProcess) -> None:
    def post(path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    hi = [{"role": "user", "content": "hi"}]
    msg = post("/v1/messages", {"model": PINNED, "max_tokens": 2, "messages": hi})
    assert msg["type"] == "message" and msg["content"][0]["type"] == "text"
    assert 1 <= msg["usage"]["output_tokens"] <= 2 and msg["usage"]["input_tokens"] > 0
    got = post("/api/chat", {"model": PINNED, "messages": hi, "stream": False, "options": {"num_predict": 2}})
    assert got["done"] is True and isinstance(got["message"]["content"], str) and got["eval_count"] <= 2


def test_kind_builds_the_worker_and_refuses_what_it_cannot_load(tmp_path: Path, model_store: Path) -> None:
    kind = MISTRALRS
    if not kind.install(Settings()).installed:
        pytest.skip("mistralrs is not installed")
    folder = write_hf_llama(tmp_path / "org" / "m")
    entry = ModelEntry("org/m", folder, None, None, format="safetensors", kind_name="chat")
    settings = Settings.flat(threads=3, parallel=2)
    plan = kind.build(entry, settings, StartContext(ppid=1, port=0, hardware=None))
    assert plan.engine == "mistral.rs" and plan.port is None and plan.health_path == "/health"
    assert plan.memory == "runtime-managed" and plan.predicted() is None  # no made-up KV estimate
    assert plan.params.source == "plain" and plan.params.max_seqs == 2 and plan.params.files == ()
    assert plan.env["RAYON_NUM_THREADS"] == "3" and plan.env["HF_HUB_OFFLINE"] == "1"
    assert "app.lanes.workers.mistralrs" in plan.argv
    (folder / "tokenizer.json").unlink()
    with pytest.raises(EngineUnavailableError, match=r"no tokenizer\.json"):
        kind.build(entry, settings, StartContext(ppid=1, port=0, hardware=None))
    awq = tmp_path / "awq"
    quant = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
    write_hf_dir(awq, DIMS.config(quantization_config=quant), llama_tensors(DIMS, "awq", group=32))
    quantized = ModelEntry("awq", awq, None, None, format="safetensors", kind_name="chat")
    with pytest.raises(EngineUnavailableError, match="AWQ-quantized; this lane loads plain safetensors"):
        kind.build(quantized, settings, StartContext(ppid=1, port=0, hardware=None))
    facts = read_gguf(model_store / "embed.gguf")
    assert isinstance(facts, GGUFFacts)
    embed = ModelEntry("embed", model_store / "embed.gguf", facts, None, (model_store / "embed.gguf",))
    assert kind.capabilities(embed) == frozenset()
    with pytest.raises(EngineUnavailableError, match="embedding model"):
        kind.build(embed, settings, StartContext(ppid=1, port=0, hardware=None))


def test_unloading_the_lane_leaves_no_process(client: openai.OpenAI, server: ServerProcess) -> None:
    ask(client, PINNED, max_tokens=1)
    pid = lanes(server)[PINNED]["pid"]
    req = urllib.request.Request(
        server.url + f"/api/models/{PINNED}/unload",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["state"] == "stopped"
    assert wait_gone([pid], 10) == []
