"""Issue 31, defect 17: logprobs with speculation. The llama.cpp build the lane runs reads no per-request
speculative setting (a request's `speculative.n_max` 0, `speculative.n_min` 0 and `speculative.types` "none"
still leave its draft on, and it gives log probabilities only for the tokens it sampled itself), so no
request can turn the draft off for itself: the answer says why its logprobs are partial, in the
`X-Switchyard-Logprobs` header and, for a whole answer, in each choice's `logprobs.partial`.

If the first test fails with 60 entries, the engine has learned the per-request switch: send it for
requests that ask for logprobs (app/lanes/lane_requests.py) and drop the note.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server

TOKENS = 60
ASKED_OFF = {"speculative.n_max": 0, "speculative.n_min": 0, "speculative.types": "none"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("logprobs")
    models = link_models(root / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    with running_server(root / "home", models) as s:
        draft = {"speculative": {"type": "draft", "draft": "tiny2", "n_max": 8}}
        assert httpx.post(s.url + "/api/models/tiny/load", json=draft, timeout=120).is_success
        yield s


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        **extra,
    }


def test_a_request_cannot_turn_the_draft_off_so_the_body_says_why(server: ServerProcess) -> None:
    r = httpx.post(server.api + "/chat/completions", json=body(**ASKED_OFF), timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    logprobs = answer["choices"][0]["logprobs"]
    assert answer["usage"]["completion_tokens"] == TOKENS
    assert len(logprobs["content"]) < TOKENS, "every token has its entry: the engine honours the request"
    header = r.headers.get("X-Switchyard-Logprobs")
    assert header and "speculative decoding (draft)" in header, header
    assert logprobs["partial"] == header  # the body says what the header says


def test_the_official_client_reads_the_note(server: ServerProcess) -> None:
    c = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)
    extra = {k: v for k, v in body().items() if k not in ("model", "messages", "max_tokens", "temperature")}
    answer = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=TOKENS,
        temperature=0,
        logprobs=True,
        extra_body={k: v for k, v in extra.items() if k != "logprobs"},
    )
    logprobs = answer.choices[0].logprobs
    note = (logprobs.model_extra or {}).get("partial") if logprobs is not None else None
    assert note and "load it with" in note, logprobs


def test_without_logprobs_nothing_is_said(server: ServerProcess) -> None:
    r = httpx.post(server.api + "/chat/completions", json=body(logprobs=False), timeout=120)
    assert r.status_code == 200 and "X-Switchyard-Logprobs" not in r.headers
    assert r.json()["choices"][0].get("logprobs") is None
