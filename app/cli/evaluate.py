"""`switchyard eval MODEL --suite FILE|NAME`: score a model with an eval suite (docs/evals.md).

The server runs the suite (POST /api/evals): every case is an ordinary request through its gateway. With
no server running, one starts in this process for the run, as `switchyard run` does. The exit code is 0
when the run reaches the threshold (or has none), 1 when it scores below it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import BadRequestError

BELOW_THRESHOLD = 1


def register(sub: Subparsers) -> None:
    ev = sub.add_parser("eval", help="score a model with an eval suite; exits 1 below the minimum score")
    ev.add_argument("model", help="the model to score (an id from `switchyard ls`)")
    ev.add_argument("--suite", help="a suite file (.yaml, .json, .jsonl) or a built-in name (arithmetic…)")
    ev.add_argument("--min-score", type=float, help="pass mark from 0 to 1 (default: the suite's threshold)")
    ev.add_argument("--history", action="store_true", help="list this model's past runs instead")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    ev.add_argument("--url", help="server address (default: the running server, else one started here)")
    ev.add_argument(
        "--detach", action="store_true", help="run as a job of the running server, print its id, return"
    )
    api_key_arg(ev)


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def _suite(text: str) -> dict[str, str]:
    """The request's suite fields: a suite file is read here and sent as text (the server reads files only
    from its suites folder); anything else is a name for the server to find."""
    path = Path(text).expanduser()
    if not path.is_file():
        return {"suite": text}
    from app.quality.suite import read_suite_file

    return {"suite": path.name, "suite_text": read_suite_file(path)}


def _show_history(runs: list[dict[str, Any]], *, out: IO[str]) -> None:
    if not runs:
        print("no eval runs yet: `switchyard eval MODEL --suite arithmetic` makes one", file=out)
        return
    rows = [("RUN", "WHEN", "SUITE", "SCORE", "MIN", "RESULT")]
    for r in runs:
        result = {True: "passed", False: "failed", None: "-"}[r["passed"]]
        if r["state"] == "unfinished":
            result = f"unfinished ({r['note']})" if r["note"] else "unfinished"
        score = "-" if r["score"] is None else f"{r['score']:.3f}"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"]))
        minimum = "-" if r["threshold"] is None else f"{r['threshold']:g}"
        rows.append((str(r["id"]), when, r["suite"], score, minimum, result))
    table(rows)


def _history(args: argparse.Namespace, ctx: CliContext) -> int:
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        runs = server.get(f"/api/evals?model={args.model}", timeout=30)["runs"]
    else:  # the same SQLite file the server writes
        from app.quality.store import EvalStore

        runs = [r.public() for r in EvalStore(ctx.paths.evals_db).runs(model=args.model, limit=100)]
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        _show_history(runs, out=sys.stdout)
    return 0


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.history:
        return _history(args, ctx)
    if not args.suite:
        raise BadRequestError("say which suite: --suite FILE or a built-in name (arithmetic, json-format)")
    if args.min_score is not None and not 0 <= args.min_score <= 1:
        raise BadRequestError("--min-score is a number from 0 to 1 (0.8 means 80 %)")
    if args.detach:
        from app.cli.jobs import start_detached

        body = {"kind": "eval", "model": args.model, **_suite(args.suite), "min_score": args.min_score}
        return start_detached(args, ctx, body, what="eval --detach")
    from app.cli.run import server_for

    body = {"model": args.model, **_suite(args.suite), "min_score": args.min_score, "stream": True}

    def show(kind: str, data: Any) -> None:
        if kind == "case" and not args.json:
            mark = "ok " if data["score"] >= 1 else ("~  " if data["score"] > 0 else "x  ")
            print(f"{_bar(data['index'], data['total'])}  {mark}{data['id']}: {data['reason']}")

    with server_for(args, ctx) as server:
        outcome = server.outcome(
            "/api/evals",
            body=body,
            timeout=900,
            show=show,
            stopped="the eval run stopped",
            unfinished="the server ended the eval run without a result; see its log, then run again",
        )
    if args.json:
        print(json.dumps(outcome, indent=2))
    else:
        verdict = {True: "PASSED", False: "FAILED", None: "scored (no minimum set)"}[outcome["passed"]]
        limit = "" if outcome["threshold"] is None else f" (minimum {outcome['threshold']:g})"
        score = f"{outcome['score']:.3f}{limit}"
        print(f"{args.model} on {outcome['suite']}: {score}: {verdict}; run {outcome['run']}")
    return BELOW_THRESHOLD if outcome["passed"] is False else 0
