"""The protocol gaps Claude Code and Codex hit, each shown with the official clients against a real server,
and `switchyard launch --print` (issue 36). The agents themselves run in tests/agents/test_live_agents.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.agents.plans import AGENTS, ModelInfo, plan, problems
from tests.conftest import REPO, ServerProcess, link_models, running_server
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf

# a random-weights model made to call a tool: see tests/server/surfaces/test_responses.py
FORCE_INPUT = [
    {"role": "user", "content": "close it"},
    {"role": "assistant", "content": "<tool_call>\n"},
]
FORCE_BIAS = {"logit_bias": {"2": 30, "35": -100, "13": -100, "12": -100, "259": -100}}
# Codex's shape: function tools nested in a namespace, beside a hosted tool
NAMESPACED = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string", "enum": ["a1"]}},
                "required": ["target"],
                "additionalProperties": False,
            },
        }
    ],
}
OVERFLOW = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("agents-protocol")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    write_tiny_gguf(models / "cold.gguf", TinySpec(seed=9))  # loaded first by the overflow-in-stream test
    with running_server(base / "home", models, "--max-loaded", "3") as s:
        yield s


# ---- Claude Code: system messages inside `messages` ---------------------------------------------------
def test_system_messages_inside_messages_fold_into_the_system_prompt(server: ServerProcess) -> None:
    # Claude Code sends {"role": "system"} among the messages; it was a 400 naming messages[1].role
    c = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    user = {"role": "user", "content": "hello"}
    inline = c.messages.count_tokens(
        model="tiny",
        system="be brief",
        messages=[user, {"role": "system", "content": [{"type": "text", "text": "and kind"}]}],  # type: ignore[list-item]
    )
    folded = c.messages.count_tokens(model="tiny", system="be brief\n\nand kind", messages=[user])  # type: ignore[list-item]
    assert inline.input_tokens == folded.input_tokens  # one system turn first, as the template wants
    answer = c.messages.create(
        model="tiny",
        max_tokens=4,
        messages=[user, {"role": "system", "content": "reminder"}],  # type: ignore[list-item]
    )
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.usage.input_tokens > 0


def test_only_system_messages_is_a_clear_400(server: ServerProcess) -> None:
    r = httpx.post(
        server.url + "/v1/messages",
        json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
        timeout=30,
    )
    assert r.status_code == 400 and "only system messages" in r.json()["error"]["message"]


def test_tools_a_template_cannot_show_are_named_in_a_header(server: ServerProcess) -> None:
    # the engine drops tools silently when the chat template has no place for them
    tool = {"name": "ls", "input_schema": {"type": "object", "properties": {}}}
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    plain = httpx.post(server.url + "/v1/messages", json={**body, "model": "tiny"}, timeout=60)
    assert plain.status_code == 200
    assert "renders no tools" in plain.headers["switchyard-tools-ignored"]
    shown = httpx.post(server.url + "/v1/messages", json={**body, "model": "tools"}, timeout=60)
    assert shown.status_code == 200 and "switchyard-tools-ignored" not in shown.headers


# ---- context overflow in each agent's own terms -------------------------------------------------------
def test_anthropic_overflow_uses_anthropics_wording(server: ServerProcess) -> None:
    c = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as exc:
        c.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "z " * 5000}])
    found = OVERFLOW.search(str(exc.value))
    assert found is not None, str(exc.value)  # what Claude Code reads to compact its conversation
    assert int(found.group(1)) > int(found.group(2)) > 0


def test_responses_overflow_mid_stream_is_context_length_exceeded(server: ServerProcess) -> None:
    # `cold` is not loaded: the 200 and the loading ticks go out before the prompt can be counted, so the
    # overflow arrives as response.failed, whose code Codex reads (server_error would make it retry)
    body = {"model": "cold", "input": "z " * 5000, "max_output_tokens": 2, "stream": True}
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", server.api + "/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    failed = [e for e in events if e["type"] == "response.failed"]
    assert failed, [e["type"] for e in events]
    assert failed[0]["response"]["error"]["code"] == "context_length_exceeded"


# ---- Codex: namespace tools and hosted tools ----------------------------------------------------------
def test_namespace_tools_are_flattened_and_calls_answered_in_the_clients_form(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    raw = client.responses.with_raw_response.create(
        model="tools",
        input=FORCE_INPUT,  # type: ignore[arg-type]
        tools=[NAMESPACED, {"type": "web_search"}],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        extra_body=FORCE_BIAS,
    )
    # the hosted tool is left out on its own, and the answer says so; the request is not refused
    assert raw.headers["switchyard-tools-dropped"] == "web_search"
    r = raw.parse()
    [call] = r.output
    assert call.type == "function_call" and call.name == "close_agent"
    assert call.namespace == "multi_agent_v1"
    assert json.loads(call.arguments) == {"target": "a1"}
    # the call and its output sent back (as Codex does) reach the engine under the flattened name
    again = client.responses.create(
        model="tools",
        input=[
            {"role": "user", "content": "close it"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "close_agent",
                "namespace": "multi_agent_v1",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "closed"},
        ],  # type: ignore[list-item]
        tools=[NAMESPACED],  # type: ignore[list-item]
        max_output_tokens=2,
    )
    assert again.status in ("completed", "incomplete")


def test_namespace_flattening_is_what_the_engine_gets() -> None:
    from app.server.surfaces.responses.translate import to_chat

    rc = to_chat(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "x"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "close_agent",
                    "namespace": "multi_agent_v1",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
            "tools": [NAMESPACED, {"type": "web_search", "external_web_access": False}],
        }
    )
    assert [t["function"]["name"] for t in rc.chat["tools"]] == ["multi_agent_v1__close_agent"]
    assert rc.chat["messages"][1]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"
    assert rc.tools.dropped == ("web_search",)
    assert rc.tools.client_name("multi_agent_v1__close_agent") == ("close_agent", "multi_agent_v1")


# ---- switchyard launch --print ------------------------------------------------------------------------
def launch(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "launch", "--url", server.url, *args],
        cwd=REPO,
        env={"SWITCHYARD_HOME": str(server.home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_launch_print_shows_each_agents_settings(server: ServerProcess) -> None:
    out = launch(server, "claude", "--model", "tools", "--print")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"ANTHROPIC_BASE_URL={server.url}" in lines and "ANTHROPIC_MODEL=tools" in lines
    assert "ANTHROPIC_DEFAULT_HAIKU_MODEL=tools" in lines and lines[-1] == "claude"
    codex = launch(server, "codex", "--model", "tools", "--print", "--", "exec", "hi there")
    assert codex.returncode == 0, codex.stderr
    assert f'base_url="{server.url}/v1",wire_api="responses"' in codex.stdout
    assert codex.stdout.splitlines()[-1].endswith("-m tools -c model_context_window=2048 exec 'hi there'")
    aider = launch(server, "aider", "--model", "tools", "--print")
    assert f"OPENAI_API_BASE={server.url}/v1" in aider.stdout and "aider --model openai/tools" in aider.stdout
    opencode = launch(server, "opencode", "--model", "tools", "--print")
    assert "OPENCODE_CONFIG=" in opencode.stdout and '"model": "switchyard/tools"' in opencode.stdout
    # --print starts nothing and writes nothing
    assert not (server.home / "agents").exists()


def test_launch_refuses_a_model_that_cannot_serve_the_agent(server: ServerProcess) -> None:
    out = launch(server, "claude", "--model", "tiny")  # no tool calls in its template, 2048 tokens
    assert out.returncode == 2
    assert "without tool calls" in out.stderr and "about 32768" in out.stderr and "--force" in out.stderr
    missing = launch(server, "claude", "--model", "tools", "--force")  # `claude` is not on this PATH
    assert missing.returncode == 2 and "npm install -g @anthropic-ai/claude-code" in missing.stderr
    unknown = launch(server, "codex", "--model", "nope", "--print")
    assert unknown.returncode == 2 and "not on this server" in unknown.stderr and "tools" in unknown.stderr


def test_launch_plan_masks_a_real_key_only() -> None:
    model = ModelInfo(id="m", kind="chat", context_length=65536, max_output=4096, tools=True)
    keyed = plan(AGENTS["claude"], model, url="http://h:1", key="sk-secret", config_dir="/x")
    assert (
        "ANTHROPIC_AUTH_TOKEN=****" in keyed.describe() and keyed.env["ANTHROPIC_AUTH_TOKEN"] == "sk-secret"
    )
    open_ = plan(AGENTS["aider"], model, url="http://h:1", key=None, config_dir="/x")
    assert "OPENAI_API_KEY=switchyard-local" in open_.describe()
    assert problems(AGENTS["claude"], model) == []
    assert problems(AGENTS["aider"], ModelInfo("m", "chat", 8192, None, False)) == []  # aider edits in text
