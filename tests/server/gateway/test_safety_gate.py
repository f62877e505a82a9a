"""Safety judges end to end on one real `switchyard serve`: a tiny text model and a tiny judge model whose
verdict a grammar pins (random weights cannot judge), the policy changed live through PUT /api/settings,
the official clients, audit.db through /api/audit, and /metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import link_models, running_server

UNSAFE = 'root ::= "Safety: Unsafe\\nCategories: Violent"'
SAFE = 'root ::= "Safety: Safe\\nCategories: None"'
CONTROVERSIAL = 'root ::= "Safety: Controversial\\nCategories: Unethical Acts"'
LONG = 'root ::= "the answer is 42 and it is a long answer that spans several windows of text"'
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("safety")
    home = root / "home"
    home.mkdir()
    # the judge loads beside the text lane; one slot of the whole context holds its template
    settings = {"max_loaded_lanes": 3, "model_overrides": {"tiny2": {"parallel": 1, "ctx_size": 2048}}}
    (home / "settings.json").write_text(json.dumps(settings))
    models = link_models(root / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    with running_server(home, models) as s:
        yield s


def _call(server: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw.startswith((b"{", b"[")) else raw.decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _policy(server: Any, grammar: str | None = None, **over: Any) -> None:
    judge: dict[str, Any] = {"model": "tiny2", "format": "qwen3guard", "timeout_s": 30}
    if grammar is not None:
        judge["grammar"] = grammar
    policy = {"enabled": True, "judges": [judge], **over}
    status, answer = _call(server, "PUT", "/api/settings", {"policy": policy})
    assert status == 200, answer


def _client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)


def test_unsafe_requests_get_each_surfaces_refusal_and_an_audit_record(server: Any) -> None:
    _policy(server, UNSAFE)
    with pytest.raises(openai.BadRequestError) as err:
        _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=4)
    assert err.value.code == "content_policy_violation" and "violence" in str(err.value)
    with pytest.raises(anthropic.BadRequestError) as aerr:
        anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert aerr.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    status, body = _call(server, "POST", "/api/chat", {"model": "tiny", "messages": HI, "stream": False})
    assert status == 400 and "safety policy refused" in body["error"]
    status, audit = _call(server, "GET", "/api/audit?verdict=unsafe&limit=3")
    assert status == 200 and audit["enabled"] is True and len(audit["records"]) == 3
    rec = audit["records"][0]
    assert (rec["judge"], rec["stage"], rec["blocked"], rec["categories"]) == (
        "tiny2",
        "request",
        True,
        ["violence"],
    )
    assert rec["text"] is None and rec["latency_ms"] > 0  # the text only with audit_text
    _, metrics = _call(server, "GET", "/metrics")
    line = 'switchyard_safety_verdicts_total{stage="request",judge="tiny2",verdict="unsafe",blocked="true"}'
    assert any(ln.startswith(line) and float(ln.split()[-1]) >= 3 for ln in metrics.splitlines())


def test_safe_and_controversial_requests_pass_and_long_texts_fit_the_judge(server: Any) -> None:
    _policy(server, SAFE, audit_text=True)
    long_text = "START " + "x" * 1500 + " END"  # over the judge's text budget: read by its start and end
    answer = _client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": long_text}], max_tokens=2
    )
    assert answer.choices[0].finish_reason in ("length", "stop")
    _, audit = _call(server, "GET", "/api/audit?limit=1")
    read = audit["records"][0]["text"]  # with audit_text: the text as the judge's prompt held it
    assert audit["records"][0]["verdict"] == "safe"
    assert read.startswith("START x") and read.endswith("x END") and "\n[...]\n" in read
    assert len(read) < len(long_text)  # the middle left out, the start and the end both read
    _policy(server, CONTROVERSIAL)  # controversial counts as safe by default
    _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)
    _policy(server, CONTROVERSIAL, controversial="unsafe")
    with pytest.raises(openai.BadRequestError):
        _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)


def test_the_responses_surface_refuses_and_cuts(server: Any) -> None:
    client = _client(server)
    _policy(server, UNSAFE)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="hi", max_output_tokens=4)
    assert err.value.code == "content_policy_violation" and "violence" in str(err.value)
    _policy(server, UNSAFE, judge="answer", stream_window=16)
    events = list(
        client.responses.create(
            model="tiny", input="hi", max_output_tokens=40, stream=True, extra_body={"grammar": LONG}
        )
    )
    last = events[-1]
    assert last.type == "response.incomplete", [e.type for e in events]
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "content_filter"
    said = "".join(getattr(e, "delta", "") for e in events if e.type == "response.output_text.delta")
    assert "42" not in said  # held back until judged, then cut
    whole = client.responses.create(
        model="tiny", input="hi", max_output_tokens=40, extra_body={"grammar": LONG}
    )
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "content_filter" and "42" not in whole.output_text
    _policy(server, SAFE, judge="answer", stream_window=16)
    whole = client.responses.create(
        model="tiny", input="hi", max_output_tokens=40, extra_body={"grammar": LONG}
    )
    assert whole.output_text.startswith("the answer is 42")  # judged safe: released
    assert whole.incomplete_details is None or whole.incomplete_details.reason == "max_output_tokens"
    _call(server, "PUT", "/api/settings", {"policy": {}})


def test_llamaguard_verdicts_and_scopes(server: Any) -> None:
    judge = {"model": "tiny2", "format": "llamaguard", "grammar": 'root ::= "unsafe\\nS9"'}
    status, _ = _call(server, "PUT", "/api/settings", {"policy": {"enabled": True, "judges": [judge]}})
    assert status == 200
    with pytest.raises(openai.BadRequestError) as err:
        _client(server).completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert "weapons" in str(err.value)
    _policy(server, UNSAFE, scope={"groups": ["ollama"]})  # only Ollama's routes are judged now
    _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)


def test_fail_open_or_closed_when_no_judge_answers(server: Any) -> None:
    # a judge that runs but answers no readable verdict (a judge that cannot run is refused when set)
    gone = {"model": "tiny2", "format": "qwen3guard", "grammar": 'root ::= "no verdict here"'}
    for fail in ("open", "closed"):
        status, _ = _call(
            server, "PUT", "/api/settings", {"policy": {"enabled": True, "judges": [gone], "fail": fail}}
        )
        assert status == 200
        if fail == "open":
            _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)
        else:
            with pytest.raises(openai.BadRequestError) as err:
                _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)
            assert "tiny2" in str(err.value) and "policy.fail is closed" in str(err.value)
    _, audit = _call(server, "GET", "/api/audit?verdict=error&limit=2")
    assert [r["judge"] for r in audit["records"]] == ["tiny2"] * 2
    assert [r["blocked"] for r in audit["records"]] == [True, False]
    # the first judge that answers decides; the failure stays recorded against the one that failed
    ok = {"model": "tiny2", "format": "qwen3guard", "grammar": SAFE}
    _call(
        server, "PUT", "/api/settings", {"policy": {"enabled": True, "judges": [gone, ok], "fail": "closed"}}
    )
    _client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=2)


def test_unsafe_answers_are_cut_with_content_filter(server: Any) -> None:
    _policy(server, UNSAFE, judge="answer", stream_window=16)
    client = _client(server)
    whole = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=40, extra_body={"grammar": LONG}
    )
    assert whole.choices[0].finish_reason == "content_filter" and whole.choices[0].message.content == ""
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=40, stream=True, extra_body={"grammar": LONG}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "content_filter" and "42" not in text  # held back, then cut
    msg = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0).messages.create(
        model="tiny",
        max_tokens=40,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"grammar": LONG},
    )
    assert msg.stop_reason == "refusal"
    body = {"model": "tiny", "messages": HI, "stream": False, "options": {"num_predict": 40}, "grammar": LONG}
    status, ollama = _call(server, "POST", "/api/chat", body)
    assert status == 200 and ollama["done_reason"] == "content_filter", ollama
    _policy(server, SAFE, judge="answer", stream_window=16)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=40, stream=True, extra_body={"grammar": LONG}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(
        "the answer is 42"
    )
    _call(server, "PUT", "/api/settings", {"policy": {}})
