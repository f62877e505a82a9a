"""Safety judges attacked on purpose (issue 33), on one real `switchyard serve` with a tiny judge whose
verdict a grammar pins: the judge reads what the model reads (system, developer and tool messages, earlier
turns), a token-id prompt is never judged as empty text, and a judge that cannot run is refused when set
and shown as not judging when it came from settings.json."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import link_models, running_server

SAFE = 'root ::= "Safety: Safe\\nCategories: None"'
JUDGE = {"model": "tiny2", "format": "qwen3guard", "timeout_s": 30, "grammar": SAFE}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("safety-harden")
    home = root / "home"
    home.mkdir()
    typo = {"enabled": True, "judges": [{"model": "tiny-gaurd", "format": "qwen3guard"}]}
    settings = {
        "max_loaded_lanes": 3,
        "model_overrides": {"tiny2": {"parallel": 1, "ctx_size": 2048}},
        "policy": typo,  # written by hand with a typo: the server must say it is not judging
    }
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
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _policy(server: Any, **over: Any) -> None:
    status, answer = _call(
        server,
        "PUT",
        "/api/settings",
        {"policy": {"enabled": True, "judges": [JUDGE], "audit_text": True, **over}},
    )
    assert status == 200, answer


def _client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)


def test_a_judge_that_cannot_run_is_shown_and_refused(server: Any) -> None:
    status, audit = _call(server, "GET", "/api/audit?limit=1")
    assert status == 200 and audit["enabled"] is True and audit["judging"] is False
    assert audit["judges"][0]["model"] == "tiny-gaurd" and audit["judges"][0]["can_judge"] is False
    typo = {"enabled": True, "judges": [{"model": "tiny-gaurd", "format": "qwen3guard"}]}
    status, answer = _call(server, "PUT", "/api/settings", {"policy": typo})
    assert status == 400 and "policy.judges[0].model 'tiny-gaurd'" in answer["error"]["message"]
    _policy(server)
    _, audit = _call(server, "GET", "/api/audit?limit=1")
    assert audit["judging"] is True and audit["judges"][0]["can_judge"] is True


@pytest.mark.parametrize("role", ["system", "developer", "tool"])
def test_the_judge_reads_every_message_the_model_reads(server: Any, role: str) -> None:
    _policy(server)
    marker = f"HIDDEN-{role.upper()}-INSTRUCTION"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    if role == "tool":
        call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": marker},
            {"role": "user", "content": "and?"},
        ]
    else:
        messages.insert(0, {"role": role, "content": marker})
    _client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    _, audit = _call(server, "GET", "/api/audit?limit=1")
    read = audit["records"][0]["text"]
    assert marker in read and f"{role}: " in read, read


def test_a_token_id_prompt_is_never_judged_as_empty(server: Any) -> None:
    _policy(server, fail="closed")
    with pytest.raises(openai.BadRequestError) as err:
        _client(server).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
    assert err.value.code == "content_policy_violation" and "token ids" in str(err.value)
    _policy(server, fail="open")  # passed, and recorded as not judged
    _client(server).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
    _, audit = _call(server, "GET", "/api/audit?verdict=error&limit=2")
    assert [(r["judge"], r["blocked"]) for r in audit["records"]] == [
        ("(gateway)", False),
        ("(gateway)", True),
    ]
    assert all("token ids" in r["reason"] for r in audit["records"])
