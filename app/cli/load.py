"""`switchyard load MODEL` and `switchyard unload MODEL`: start or stop a model's lane on the running server.

Both go through the running server (a lane lives there); `unload` is what `rm` asks for while a model
is loaded. `load` of a loaded model tests it again, as the admin route does.
"""

from __future__ import annotations

import argparse
import urllib.parse

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg
from app.core.errors import ServerNotRunningError


def register(sub: Subparsers) -> None:
    for name, text in (
        ("load", "start a model's lane on the running server now (rather than on its first request)"),
        ("unload", "stop a model's lane on the running server, freeing its memory"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("model", help="a model id from `switchyard ls` (or `switchyard ps` for unload)")
        p.add_argument("--url", help="server address (default: the one the running server recorded)")
        api_key_arg(p)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    server = ctx.running(args.url, api_key=args.api_key)
    if server is None:
        raise ServerNotRunningError(
            f"no Switchyard server is running to {args.command} {args.model!r} on; start one with "
            "`switchyard serve`" + (" (a model loads on its first request)" if args.command == "load" else "")
        )
    path = f"/api/models/{urllib.parse.quote(args.model, safe='/:')}/{args.command}"
    lane = server.call("POST", path, timeout=600 if args.command == "load" else 120)
    state = lane.get("state", "?")
    if args.command == "load":
        print(f"loaded {args.model}: lane {state}" + (f" on port {lane['port']}" if lane.get("port") else ""))
    else:
        print(f"unloaded {args.model}: lane {state}")
    return 0
