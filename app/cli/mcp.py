"""`switchyard mcp add|ls|rm|allow|ask|deny`: MCP tool servers registered on this machine (docs/mcp.md).

`add NAME URL` registers a streamable-HTTP server, `add NAME -- COMMAND ARGS...` a stdio one; `--env` and
`--header` values go to the keyring (the state file keeps only their names). Each tool is asked about by
default; `allow`/`deny` set it per tool, server-wide or (`--key KEYNAME`) for one API key. The Responses
API's mcp tool names a server by its NAME.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from app.cli.context import CliContext
from app.cli.options import Subparsers, show_list
from app.core.errors import BadRequestError


def register(sub: Subparsers) -> None:
    mcp = sub.add_parser(
        "mcp", help="MCP tool servers for the Responses API's mcp tool: add, ls, rm, permissions"
    )
    ms = mcp.add_subparsers(dest="mcp_command", metavar="{add,ls,rm,allow,ask,deny}", required=True)
    add = ms.add_parser("add", help="register a server: `add NAME URL` or `add NAME -- COMMAND ARGS...`")
    add.add_argument("name", help="the server's name (its server_label in requests): letters, digits, . _ -")
    add.add_argument("target", nargs="+", help="an http(s) URL (streamable HTTP), or, after --, a command")
    add.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="an environment variable (kept in the keyring)",
    )
    add.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an HTTP header (kept in the keyring)",
    )
    add.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="the deadline of one tool call (default 30)"
    )
    ls = ms.add_parser("ls", help="the registered servers and their tools' permissions")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    rm = ms.add_parser("rm", help="remove a server and its secrets")
    rm.add_argument("name", help="the server's name, as `switchyard mcp ls` shows it")
    for perm, what in (
        ("allow", "run without asking"),
        ("ask", "ask the client first (the default)"),
        ("deny", "never run"),
    ):
        p = ms.add_parser(perm, help=f"a tool of a server: {what}")
        p.add_argument("name", help="the server's name")
        p.add_argument("tool", help="the tool's name, as the server lists it")
        p.add_argument(
            "--key",
            metavar="KEYNAME",
            help="only for requests made with this API key (`switchyard keys ls`); it wins over the "
            "server-wide permission",
        )


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise BadRequestError(f"{flag} takes KEY=VALUE, got {v!r}")
        out[key] = value
    return out


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.mcp.registry import McpRegistry

    reg = McpRegistry.of(ctx.paths)
    cmd = args.mcp_command
    if cmd == "add":
        env, headers = _pairs(args.env, "--env"), _pairs(args.header, "--header")
        target: list[str] = args.target
        if len(target) == 1 and target[0].startswith(("http://", "https://")):
            spec = reg.add(args.name, url=target[0], env=env, headers=headers, timeout_s=args.timeout)
        else:
            if len(target) == 1 and "://" in target[0]:
                raise BadRequestError(f"{target[0]!r}: an MCP server URL must be http:// or https://")
            if headers:
                raise BadRequestError("--header is for an HTTP server; a command gets --env")
            spec = reg.add(args.name, command=tuple(target), env=env, timeout_s=args.timeout)
        where = spec.url or " ".join(spec.command)
        print(f"registered MCP server {spec.name!r} ({where}); its tools ask before they run")
        print(f"use it as {{'type': 'mcp', 'server_label': '{spec.name}'}} in /v1/responses tools")
        return 0
    if cmd == "rm":
        gone = reg.remove(args.name)
        print(f"removed MCP server {gone.name!r} and its secrets")
        return 0
    if cmd in ("allow", "ask", "deny"):
        from app.mcp.registry import check_key

        key = check_key(ctx.paths, args.key) if args.key is not None else None
        reg.set_permission(args.name, tool=args.tool, permission=cmd, key=key)
        print(f"{args.name}: tool {args.tool!r} is now {cmd}" + (f" for API key {key!r}" if key else ""))
        return 0
    servers = reg.all()
    show_list(
        {"file": str(reg.path), "servers": [s.public() for s in servers]},
        as_json=args.json,
        empty="no MCP servers; add one with `switchyard mcp add NAME URL` or "
        "`switchyard mcp add NAME -- COMMAND`",
        rows=lambda: [
            ("NAME", "TRANSPORT", "TARGET", "TOOLS"),
            *(
                (
                    s.name,
                    "stdio" if s.command else "http",
                    s.url or " ".join(s.command),
                    _permissions(s.tools, s.keys),
                )
                for s in servers
            ),
        ],
    )
    return 0


def _permissions(tools: Mapping[str, str], keys: Mapping[str, Mapping[str, str]]) -> str:
    out = ", ".join(f"{t}={p}" for t, p in sorted(tools.items())) or "all ask"
    for key, rules in sorted(keys.items()):  # an API key's own rules, which win for its requests
        out += f"; key {key}: " + ", ".join(f"{t}={p}" for t, p in sorted(rules.items()))
    return out
