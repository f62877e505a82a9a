"""Defaults that suit editor agents on the llama.cpp lane (issue 16): the per-slot context a model starts
with, the output cap a request without a limit gets, what /v1/models and Ollama's show report, and LoRA
adapters served as `BASE+ADAPTER` ids. One real `serve` with tiny models for all the engine checks."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.errors import SettingsError
from app.core.settings import Settings
from app.lanes.engines.llamacpp.request_defaults import (
    default_max_output,
    max_output,
    split_adapter_id,
    with_adapter,
    with_max_output,
)
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.loragen import write_tiny_lora
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf

CAP = 7  # tiny's max_output in the server's settings: a request without max_tokens stops there


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("defaults")
    models = link_models(root / "models", model_store / "tiny.gguf")
    write_tiny_gguf(models / "hermes.gguf", TinySpec(seed=5, chat_template=HERMES_TOOLS, n_ctx_train=4096))
    write_tiny_lora(models / "lora.gguf")
    home = root / "home"
    home.mkdir()
    overrides = {"tiny": {"max_output": CAP, "lora": [{"file": "lora.gguf", "scale": 1.0}]}}
    (home / "settings.json").write_text(json.dumps({"parallel": 2, "model_overrides": overrides}))
    with running_server(home, models) as s:
        yield s


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)


def get(server: ServerProcess, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def models(server: ServerProcess) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in get(server, "/v1/models")["data"]}


# ---- pure rules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("slot", "cap"), [(512, 512), (2048, 1024), (4096, 1024), (16384, 4096), (131072, 8192)]
)
def test_the_default_cap_is_a_quarter_of_the_slot_within_bounds(slot: int, cap: int) -> None:
    assert default_max_output(slot) == cap


def test_an_override_is_cut_to_the_slot_and_a_bad_one_says_what_to_do() -> None:
    s = Settings.flat(model_overrides={"m": {"max_output": 99999}})
    assert max_output("m", s, slot_ctx=4096) == 4096 and max_output("other", s, slot_ctx=4096) == 1024
    with pytest.raises(SettingsError, match=r"max_output'\] must be at least 1"):
        Settings.flat(model_overrides={"m": {"max_output": 0}})


def test_a_request_limit_of_its_own_is_kept() -> None:
    assert with_max_output({"max_tokens": 5}, limit=9) is None
    assert with_max_output({"max_completion_tokens": 5}, limit=9) is None
    assert with_max_output({"n_predict": -1}, limit=9) is None  # the client's own, even "no limit"
    assert with_max_output({"max_tokens": None}, limit=9) == {"max_tokens": 9}  # null: none named
    assert with_max_output({"messages": []}, limit=9) == {"messages": [], "max_tokens": 9}


def test_adapter_scales_follow_the_model_id() -> None:
    paths, scales = ["/m/a.gguf", "/m/b.gguf"], [1.0, 0.5]
    on_b = with_adapter({"model": "base+b"}, model_id="base", paths=paths, scales=scales)
    assert on_b is not None and on_b["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    bare = with_adapter({"model": "base"}, model_id="base", paths=paths, scales=scales)
    assert bare is not None and [a["scale"] for a in bare["lora"]] == [0.0, 0.0]
    assert with_adapter({"lora": []}, model_id="base", paths=paths, scales=scales) is None
    assert split_adapter_id("org/m+x") == ("org/m", "x") and split_adapter_id("plain") is None


# ---- the real engine -------------------------------------------------------------------------------------
def test_unloaded_models_report_the_planned_slot_and_tools(server: ServerProcess) -> None:
    hermes = models(server)["hermes"]
    # the trained window per slot (it fits here), a quarter of it as the cap, tools from the template
    assert hermes["context_length"] == 4096 and hermes["max_output"] == 1024 and hermes["tools"] is True
    tiny = models(server)["tiny"]
    assert tiny["context_length"] == 2048 and tiny["max_output"] == CAP and tiny["tools"] is False


def test_a_request_without_a_limit_stops_at_the_cap(server: ServerProcess) -> None:
    c = client(server)
    msgs: Any = [{"role": "user", "content": "hi"}]
    out = c.chat.completions.create(model="tiny", messages=msgs, extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == CAP
    out = c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 3  # its own limit wins
    done = c.completions.create(model="tiny", prompt="hi", extra_body={"ignore_eos": True})
    assert done.usage is not None and done.usage.completion_tokens == CAP


def test_the_started_lane_holds_the_trained_window_per_slot(server: ServerProcess) -> None:
    client(server).completions.create(model="tiny", prompt="hi", max_tokens=1)
    lane = next(x for x in get(server, "/api/lanes")["lanes"] if x["model"] == "tiny")
    assert lane["params"]["ctx_size"] == 2048 * 2 and lane["params"]["parallel"] == 2
    assert models(server)["tiny"]["context_length"] == 2048  # now from the running lane
    shown = get(server, "/api/show", {"model": "tiny"})
    assert shown["parameters"] == f"num_ctx 2048\nnum_predict {CAP}"
    assert shown["model_info"]["llama.context_length"] == 2048  # the trained window, as Ollama says it


def test_an_adapter_is_its_own_model_id(server: ServerProcess) -> None:
    listed = models(server)
    assert listed["tiny+lora"]["base"] == "tiny" and listed["tiny+lora"]["adapter"] == "lora"

    def answer(model: str, **extra: Any) -> str:
        out = client(server).completions.create(
            model=model, prompt="hello", max_tokens=12, temperature=0, extra_body=extra or None
        )
        return out.choices[0].text

    plain, adapted = answer("tiny"), answer("tiny+lora")
    assert adapted != plain  # greedy, same prompt: only the adapter's scale differs
    assert adapted == answer("tiny", lora=[{"id": 0, "scale": 1.0}])  # the client's own lora is kept
    assert plain == answer("tiny", lora=[{"id": 0, "scale": 0.0}])
    with pytest.raises(openai.NotFoundError):
        answer("tiny+nothing")


def test_editor_snippets_carry_the_limits_and_tools() -> None:
    pytest.importorskip("PySide6")
    from app.lanes.engines.llamacpp.request_defaults import ModelLimits
    from app.ui.pages.server import _snippets

    text = _snippets("http://127.0.0.1:8686/v1", "m", limits=ModelLimits(8192, 2048, True))
    assert "defaultCompletionOptions: {contextLength: 8192, maxTokens: 2048}" in text
    assert "capabilities: [tool_use]" in text and '"tools": true' in text and '"toolCalling": true' in text
    assert '"maxInputTokens": 6144, "maxOutputTokens": 2048' in text  # the slot holds input and output
    plain = _snippets("http://127.0.0.1:8686/v1", "m", limits=ModelLimits(4096, 1024, False))
    assert "tool_use" not in plain and '"toolCalling": false' in plain
