"""Thinking controls on the translated surfaces reach the chat template's switch, and a model whose
template has no switch says so instead of ignoring the field (issue 36)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.core.errors import BadRequestError
from app.server.surfaces.responses.translate import to_chat
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import CHATML, TinySpec, write_tiny_gguf

# a ChatML template with a Qwen3-style switch: thinking off opens the answer with an empty think block
THINKING = CHATML.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}",
)
HEADER = "switchyard-thinking-ignored"


def test_responses_reasoning_effort_becomes_the_templates_switch() -> None:
    base = {"model": "m", "input": "hi"}
    assert to_chat({**base, "reasoning": {"effort": "high"}}).chat["chat_template_kwargs"] == {
        "enable_thinking": True,
        "reasoning_effort": "high",
    }
    assert to_chat({**base, "reasoning": {"effort": "none"}}).chat["chat_template_kwargs"] == {
        "enable_thinking": False,
        "reasoning_effort": "none",
    }
    # Codex sends only a summary preference: the template's default stands
    assert "chat_template_kwargs" not in to_chat({**base, "reasoning": {"summary": "auto"}}).chat
    with pytest.raises(BadRequestError, match=r"reasoning\.effort must be one of"):
        to_chat({**base, "reasoning": {"effort": "max"}})
    with pytest.raises(BadRequestError, match="'reasoning' must be an object"):
        to_chat({**base, "reasoning": "high"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("reasoning")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_tiny_gguf(models / "thinker.gguf", TinySpec(seed=5, chat_template=THINKING))
    with running_server(base / "home", models, "--max-loaded", "2") as s:
        yield s


def test_a_template_without_a_switch_says_so_on_each_surface(server: ServerProcess) -> None:
    hi = [{"role": "user", "content": "hi"}]
    asks = [
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "reasoning": {"effort": "low"}}),
        (
            "/v1/messages",
            {"messages": hi, "max_tokens": 2, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        ),
        ("/api/chat", {"messages": hi, "stream": False, "think": True, "options": {"num_predict": 2}}),
    ]
    for path, body in asks:
        plain = httpx.post(server.url + path, json={**body, "model": "tiny"}, timeout=60)
        assert plain.status_code == 200, (path, plain.text)
        assert "has no thinking switch" in plain.headers[HEADER], path
        switched = httpx.post(server.url + path, json={**body, "model": "thinker"}, timeout=60)
        assert switched.status_code == 200 and HEADER not in switched.headers, path


def test_thinking_off_reaches_the_template(server: ServerProcess) -> None:
    # the switch renders an empty think block into the prompt: more prompt tokens with thinking off
    def prompt_tokens(effort: str) -> int:
        body = {"model": "thinker", "input": "hi", "max_output_tokens": 1, "reasoning": {"effort": effort}}
        r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["input_tokens"])

    assert prompt_tokens("none") > prompt_tokens("high")


def test_chat_completions_reasoning_effort_reaches_the_template(server: ServerProcess) -> None:
    import openai

    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)

    def prompt_tokens(effort: str) -> int:
        r = client.chat.completions.create(
            model="thinker",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            reasoning_effort=effort,  # type: ignore[arg-type]
        )
        assert r.usage is not None
        return r.usage.prompt_tokens

    assert prompt_tokens("none") > prompt_tokens("high")
