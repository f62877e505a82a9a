"""What `switchyard launch AGENT` sets for each coding agent, and whether a model can serve it.

Each agent is configured only through what it documents for a custom endpoint: environment variables
(Claude Code, aider), `-c key=value` overrides on its command line (Codex), or a config file of our own that
an environment variable points at (OpenCode). No file of the user's is written, so there is nothing to
back up. Pure: the caller reads the server's model list and runs the plan.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.errors import BadRequestError, ModelNotFoundError

# the key an agent sends where the server asks for none: agents refuse to start without some key
NO_KEY = "switchyard-local"


@dataclass(frozen=True)
class AgentSpec:
    """One agent: its command, where it comes from, and what a model needs to drive it."""

    name: str
    title: str
    command: str
    install: str  # how to install it, said when it is missing
    surface: str  # the API it speaks to us
    needs_tools: bool  # it acts through tool calls (aider edits through text formats instead)
    min_context: int  # its own prompt and tool definitions take most of this on a first turn


AGENTS: dict[str, AgentSpec] = {
    a.name: a
    for a in (
        AgentSpec(
            "claude",
            "Claude Code",
            "claude",
            "npm install -g @anthropic-ai/claude-code",
            "anthropic",
            True,
            32768,
        ),
        AgentSpec("codex", "Codex CLI", "codex", "npm install -g @openai/codex", "responses", True, 16384),
        AgentSpec("opencode", "OpenCode", "opencode", "npm install -g opencode-ai", "openai", True, 16384),
        AgentSpec("aider", "aider", "aider", "python -m pip install aider-install", "openai", False, 8192),
    )
}


@dataclass(frozen=True)
class ModelInfo:
    """What GET /v1/models says of one model."""

    id: str
    kind: str | None
    context_length: int | None
    max_output: int | None
    tools: bool | None

    @classmethod
    def from_listing(cls, entry: Mapping[str, Any]) -> ModelInfo:
        def num(key: str) -> int | None:
            v = entry.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        tools = entry.get("tools")
        return cls(
            id=str(entry["id"]),
            kind=entry.get("kind") if isinstance(entry.get("kind"), str) else None,
            context_length=num("context_length"),
            max_output=num("max_output"),
            tools=tools if isinstance(tools, bool) else None,
        )


@dataclass(frozen=True)
class LaunchPlan:
    """The command to run, the environment laid over the caller's, and files of our own to write."""

    agent: AgentSpec
    model: ModelInfo
    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: Mapping[str, str]  # path -> content; only under Switchyard's own data folder
    secret_env: frozenset[str]  # keys of `env` whose values are not printed

    def describe(self) -> list[str]:
        """The plan as `--print` shows it: environment, files, command; secrets masked."""
        lines = [f"# {self.agent.title} on {self.model.id} (the server's {self.agent.surface} API)"]
        for key, value in self.env.items():
            lines.append(f"{key}=****" if key in self.secret_env else f"{key}={_quote(value)}")
        for path, content in self.files.items():
            lines.append(f"# writes {path}:")
            lines += [f"#   {line}" for line in content.splitlines()]
        lines.append(" ".join(_quote(a) for a in self.argv))
        return lines


def _quote(value: str) -> str:
    safe = value and all(c.isalnum() or c in "-_./:=@,+%" for c in value)
    return value if safe else "'" + value.replace("'", "'\"'\"'") + "'"


def pick_model(models: list[ModelInfo], wanted: str | None) -> ModelInfo:
    """The model named, else the first chat model that lists tools, else the first chat model."""
    chat = [m for m in models if m.kind in (None, "chat")]
    if wanted is not None:
        for m in models:
            if m.id == wanted:
                return m
        names = ", ".join(m.id for m in chat) or "none"
        raise ModelNotFoundError(
            f"model {wanted!r} is not on this server; chat models here: {names} (`switchyard ls`)",
            param="model",
        )
    if not chat:
        raise ModelNotFoundError("this server has no chat model; pull one first (`switchyard pull REPO`)")
    return next((m for m in chat if m.tools), chat[0])


def problems(agent: AgentSpec, model: ModelInfo) -> list[str]:
    """Why `model` cannot serve `agent` well (empty when it can); each line says what to do."""
    out: list[str] = []
    if model.kind not in (None, "chat"):
        out.append(f"{model.id!r} is a {model.kind} model, not a chat model; pick a chat model with --model")
    if agent.needs_tools and model.tools is False:
        out.append(
            f"{model.id!r} has a chat template without tool calls, and {agent.title} works through tools; "
            'pick a model whose /v1/models entry says "tools": true'
        )
    if model.context_length is not None and model.context_length < agent.min_context:
        out.append(
            f"{model.id!r} has a context of {model.context_length} tokens per request; {agent.title} needs "
            f"about {agent.min_context} (its own instructions and tool definitions fill most of it): raise "
            f"ctx_size in model_overrides[{model.id!r}] (settings.json) or pick a larger-context model"
        )
    return out


def plan(
    agent: AgentSpec,
    model: ModelInfo,
    *,
    url: str,
    key: str | None,
    config_dir: str,
    extra: tuple[str, ...] = (),
) -> LaunchPlan:
    """The plan for `agent` on `model` at server `url` (no trailing slash); `config_dir` is where a
    config file of our own may go (OpenCode's)."""
    token = key or NO_KEY
    secret = key is not None  # the stand-in key is no secret: --print shows exactly what is sent
    if agent.name == "claude":
        env = {
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_AUTH_TOKEN": token,  # sent as a Bearer token; the server accepts it as its key
            "ANTHROPIC_MODEL": model.id,
            # the background and sub-agent models it would otherwise ask for by Anthropic's names
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model.id,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model.id,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model.id,
            "ANTHROPIC_SMALL_FAST_MODEL": model.id,
            "CLAUDE_CODE_SUBAGENT_MODEL": model.id,
        }
        if model.context_length is not None:
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(model.context_length)
        if model.max_output is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(model.max_output)
        return _plan(agent, model, ("claude", *extra), env, {}, {"ANTHROPIC_AUTH_TOKEN"}, secret)
    if agent.name == "codex":
        provider = (
            'model_providers.switchyard={name="Switchyard",'
            f'base_url="{url}/v1",wire_api="responses",env_key="SWITCHYARD_AGENT_KEY"}}'
        )
        argv = ["codex", "-c", "model_provider=switchyard", "-c", provider, "-m", model.id]
        if model.context_length is not None:
            argv += ["-c", f"model_context_window={model.context_length}"]
        env = {"SWITCHYARD_AGENT_KEY": token}
        return _plan(agent, model, (*argv, *extra), env, {}, {"SWITCHYARD_AGENT_KEY"}, secret)
    if agent.name == "opencode":
        path = f"{config_dir}/opencode.json"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "switchyard": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Switchyard",
                    "options": {"baseURL": f"{url}/v1", "apiKey": "{env:SWITCHYARD_AGENT_KEY}"},
                    "models": {model.id: {"name": model.id}},
                }
            },
            "model": f"switchyard/{model.id}",
        }
        env = {"OPENCODE_CONFIG": path, "SWITCHYARD_AGENT_KEY": token}
        files = {path: json.dumps(config, indent=2) + "\n"}
        return _plan(agent, model, ("opencode", *extra), env, files, {"SWITCHYARD_AGENT_KEY"}, secret)
    if agent.name == "aider":
        env = {"OPENAI_API_BASE": f"{url}/v1", "OPENAI_API_KEY": token}
        command = ("aider", "--model", f"openai/{model.id}", *extra)
        return _plan(agent, model, command, env, {}, {"OPENAI_API_KEY"}, secret)
    raise BadRequestError(f"unknown agent {agent.name!r}; choose one of {', '.join(AGENTS)}", param="agent")


def _plan(
    agent: AgentSpec,
    model: ModelInfo,
    argv: tuple[str, ...] | list[str],
    env: dict[str, str],
    files: dict[str, str],
    secrets: set[str],
    secret: bool,
) -> LaunchPlan:
    masked = frozenset(secrets) if secret else frozenset()
    return LaunchPlan(agent=agent, model=model, argv=tuple(argv), env=env, files=files, secret_env=masked)


def agent_spec(name: str) -> AgentSpec:
    if name not in AGENTS:
        raise BadRequestError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)}", param="agent")
    return AGENTS[name]
