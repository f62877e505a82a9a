"""`switchyard launch AGENT [--model M] [--print] [-- AGENT-ARGS...]`: a coding agent on the running server.

The model is checked first (a chat model, tool calls where the agent needs them, enough context); the
agent is then started with its base URL, key and model set the way it documents (app/agents/plans.py),
and its exit code is ours. `--print` shows what would be set and run, and starts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers
from app.core.errors import BadRequestError, CapabilityMissingError

_FLAGS = ("--model", "--print", "--force", "--url", "--api-key")


def _options(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The launch flags; also parsed again from what follows AGENT (see run), where they are left unset
    unless given."""
    keep: dict[str, Any] = {} if defaults else {"default": argparse.SUPPRESS}
    p.add_argument("--model", help="the model to use (default: the first chat model with tool calls)", **keep)
    p.add_argument(
        "--print", action="store_true", help="show what would be set and run; start nothing", **keep
    )
    p.add_argument(
        "--force", action="store_true", help="start even when the model check finds problems", **keep
    )
    p.add_argument("--url", help="server address (default: the one the running server recorded)", **keep)
    p.add_argument(
        "--api-key", help="key for a server that requires one (default: $SWITCHYARD_API_KEY)", **keep
    )


def register(sub: Subparsers) -> None:
    from app.agents.plans import AGENTS

    p = sub.add_parser(
        "launch",
        help="start a coding agent (Claude Code, Codex, OpenCode, aider) on this server's model",
        description="Checks the model, sets the agent's base URL, key and model through its own documented "
        "settings (never writing your config files), and starts it. Arguments after `--` go to the agent.",
    )
    p.add_argument("agent", choices=sorted(AGENTS), help="the agent to start")
    _options(p)
    # everything after AGENT: launch flags up to `--`, then the agent's own arguments
    p.add_argument("rest", nargs=argparse.REMAINDER, help="[launch flags] -- [arguments for the agent]")


def _split(args: argparse.Namespace) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """The launch flags given after AGENT laid over those before it, and the agent's own arguments."""
    rest = list(args.rest)
    late = argparse.ArgumentParser(prog="switchyard launch AGENT", add_help=False)
    _options(late, defaults=False)
    if "--" in rest:
        cut = rest.index("--")
        flags, agent_args = rest[:cut], rest[cut + 1 :]
    elif rest and rest[0].split("=", 1)[0] not in _FLAGS:
        flags, agent_args = [], rest  # argparse drops a `--` that comes right after AGENT
    else:
        flags, agent_args = rest, []
    return late.parse_args(flags, namespace=args), tuple(agent_args)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.agents.plans import ModelInfo, agent_spec, pick_model, plan, problems

    args, extra = _split(args)
    agent = agent_spec(args.agent)
    server = ctx.server(args.url, api_key=args.api_key)
    listing = server.get("/v1/models", timeout=30).get("data") or []
    model = pick_model([ModelInfo.from_listing(m) for m in listing], args.model)
    key = server.key.reveal() if server.key is not None else None
    launch = plan(
        agent, model, url=server.url, key=key, config_dir=str(ctx.paths.home / "agents"), extra=extra
    )
    found = problems(agent, model)
    if args.print:
        for line in found:
            print(f"# warning: {line}")
        print("\n".join(launch.describe()))
        return 0
    if found and not args.force:
        raise CapabilityMissingError(
            "; ".join(found) + f" (or run `switchyard launch {agent.name} --force` to start it anyway)"
        )
    exe = shutil.which(launch.argv[0])
    if exe is None:
        raise BadRequestError(
            f"{agent.title} is not installed (no `{launch.argv[0]}` on PATH); "
            f"install it with: {agent.install}"
        )
    for path, content in launch.files.items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    env = {**os.environ, **launch.env}
    # a child, not exec: Ctrl-C reaches the agent (same process group), and its exit code is returned
    try:
        return subprocess.call([exe, *launch.argv[1:]], env=env)
    except KeyboardInterrupt:
        return 130
