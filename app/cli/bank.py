"""`switchyard bank ls / clear`: the session bank of saved llama.cpp conversations (docs/engines.md).

Through the running server when one answers (its lanes may be saving into the bank right now), else on
the bank's files directly.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.units import fmt_bytes

MIB = 1024 * 1024


def register(sub: Subparsers) -> None:
    bank = sub.add_parser("bank", help="the session bank: conversations saved when a lane stops")
    verbs = bank.add_subparsers(dest="bank_command", required=True, metavar="{ls,clear}")
    ls = verbs.add_parser("ls", help="list the saved conversations and the bank's size")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    clear = verbs.add_parser("clear", help="drop saved conversations (all, or one model's)")
    clear.add_argument("model", nargs="?", help="only this model's (default: every model's)")
    for p in (ls, clear):
        p.add_argument("--url", help="server address (default: the one the running server recorded)")
        api_key_arg(p)


def _summary(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        summary: dict[str, Any] = server.get("/api/bank", timeout=30)
        return summary
    from app.lanes.bank.sessions import bank_summary

    budget = ctx.base_settings().models.session_bank_budget_mib * MIB
    return bank_summary(ctx.paths.home, budget_bytes=budget)


def _clear(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        query = f"?model={urllib.parse.quote(args.model)}" if args.model else ""
        answer: dict[str, Any] = server.call("DELETE", "/api/bank" + query, timeout=30)
        return answer
    from app.lanes.bank.sessions import bank_clear

    return dict(bank_clear(ctx.paths.home, model_id=args.model))


def _age(ts: float) -> str:
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.bank_command == "clear":
        done = _clear(args, ctx)
        whose = f"{args.model}'s" if args.model else "every"
        print(f"dropped {done['dropped']} of {whose} saved conversations ({fmt_bytes(done['bytes'])})")
        return 0
    summary = _summary(args, ctx)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    rows = summary["checkpoints"]
    used, budget = fmt_bytes(summary["bytes"]), fmt_bytes(summary["budget_bytes"])
    print(f"session bank: {len(rows)} saved conversation(s), {used} of {budget}")
    if rows:
        lines = [("MODEL", "TOKENS", "MESSAGES", "SIZE", "LAST USED")]
        for cp in rows:
            lines.append(
                (
                    cp["model"],
                    str(cp["tokens"]),
                    str(cp["messages"]),
                    fmt_bytes(cp["bytes"]),
                    _age(cp["last_used"]),
                )
            )
        table(lines)
    return 0
