"""`switchyard updates [--check] [--json]`: which pulled models have a newer commit on the hub whose files
differ from theirs (docs/jobs.md#update-checks).

The server checks every `update_check_h` hours; `--check` asks it to check now. With no server running,
the last check's results (updates.json) are shown.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from app.cli.context import CliContext
from app.cli.jobs import needed_server
from app.cli.options import Subparsers, api_key_arg, table


def register(sub: Subparsers) -> None:
    u = sub.add_parser(
        "updates", help="pulled models with a newer revision on the hub (checked periodically)"
    )
    u.add_argument("--check", action="store_true", help="ask the hub now instead of showing the last check")
    u.add_argument("--all", action="store_true", help="also list the models that are up to date")
    u.add_argument("--json", action="store_true", help="machine-readable output")
    u.add_argument("--url", help="server address (default: the one the running server recorded)")
    api_key_arg(u)


def _fetch(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    if args.check:
        return dict(needed_server(args, ctx, what="--check").call("POST", "/api/updates/check", timeout=600))
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        return dict(server.get("/api/updates", timeout=30))
    from app.hub.update_check import read_updates

    return read_updates(ctx.paths.home / "updates.json")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = _fetch(args, ctx)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    when = doc.get("checked_at")
    if not when:
        print("no update check has run yet; `switchyard updates --check` runs one (needs a running server)")
        return 0
    print(f"last checked {int((time.time() - when) // 60)} min ago")
    shown = [u for u in doc.get("updates") or [] if args.all or u.get("available")]
    if shown:
        rows = [["MODEL", "CURRENT", "HUB", "CHANGED FILES"]]
        for u in shown:
            files = ", ".join([*u["changed"], *(f"{m} (gone)" for m in u["missing"])]) or "up to date"
            rows.append([u["model"], u["current"][:12], u["head"][:12], files])
        table(rows)
        print("`switchyard update MODEL` fetches one (with its gate, if it has one)")
    else:
        print("every pulled model is up to date")
    for repo, error in (doc.get("errors") or {}).items():
        print(f"could not check {repo}: {error}")
    return 0
