"""`switchyard notify test`: post a test message to every webhook in settings `notify.webhooks` through
the running server, and report what each answered (docs/jobs.md#notifications)."""

from __future__ import annotations

import argparse

from app.cli.context import CliContext
from app.cli.jobs import needed_server
from app.cli.options import Subparsers, api_key_arg, show_list

EXIT_OK, EXIT_FAILED = 0, 1


def register(sub: Subparsers) -> None:
    n = sub.add_parser("notify", help="webhooks for job ends, failed gates, refusals and engine crashes")
    n.add_argument("action", choices=("test",), help="test: post a test message to each hook")
    n.add_argument("--json", action="store_true", help="machine-readable output")
    n.add_argument("--url", help="server address (default: the one the running server recorded)")
    api_key_arg(n)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    hooks = needed_server(args, ctx, what="`notify test`").call("POST", "/api/notify/test", timeout=60)[
        "hooks"
    ]
    show_list(
        hooks,
        as_json=args.json,
        empty='no webhooks: add them to settings.json as "notify": '
        '{"webhooks": [{"url": ..., "kind": "json"}]}',
        rows=lambda: [
            ("URL", "KIND", "ANSWER"),
            *(
                (h["url"], h["kind"], f"HTTP {h['status']}" if h["status"] else h.get("error", "?"))
                for h in hooks
            ),
        ],
        pad_last=False,
    )
    return EXIT_OK if all(h["ok"] for h in hooks) else EXIT_FAILED
