"""`switchyard jobs [--json]`, `switchyard jobs follow ID`, `switchyard jobs cancel ID`, and the one
`--detach` path of pull, update, engine install and eval (start_detached): the job runs in the server.

With no server running, `jobs` lists the finished jobs the last server saved (jobs.json); following,
cancelling and detaching need a running server and say so.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import ServerNotRunningError, SwitchyardError

EXIT_OK, EXIT_FAILED = 0, 1
_NEEDS_SERVER = "needs a running server (the job runs there): start one with `switchyard serve`"


def register(sub: Subparsers) -> None:
    j = sub.add_parser("jobs", help="list the server's jobs (downloads, engine installs, updates, evals)")
    j.add_argument("action", nargs="?", choices=("follow", "cancel"), help="follow or cancel one job")
    j.add_argument("id", nargs="?", help="the job's id (from `switchyard jobs`)")
    j.add_argument("--json", action="store_true", help="machine-readable output")
    j.add_argument("--url", help="server address (default: the one the running server recorded)")
    api_key_arg(j)


def needed_server(args: argparse.Namespace, ctx: CliContext, *, what: str) -> ServerClient:
    """The running server, or a ServerNotRunningError that says `what` needs one."""
    server = ctx.running(getattr(args, "url", None), api_key=getattr(args, "api_key", None))
    if server is None:
        raise ServerNotRunningError(f"{what} {_NEEDS_SERVER}")
    return server


def start_detached(args: argparse.Namespace, ctx: CliContext, body: dict[str, Any], *, what: str) -> int:
    """POST /api/jobs and print the job id at once (`--detach`); `--json` prints the whole answer."""
    server = needed_server(args, ctx, what=what)
    answer = server.call("POST", "/api/jobs", body=body, timeout=120)
    job = answer.get("job")
    if getattr(args, "json", False):
        print(json.dumps(answer, indent=2))
    elif job is None:
        print("already up to date: nothing to do")
    else:
        print(job["id"])
        print(f"started {job['title']}; follow it with `switchyard jobs follow {job['id']}`")
    return EXIT_OK


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    s = max(0, int(time.time() - ts))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def _progress(job: dict[str, Any]) -> str:
    step = job["steps"][-1] if job.get("steps") else None
    if step is None:
        return ""
    if job.get("progress") is not None:
        return f"{step['name']} {job['progress'] * 100:.0f}%"
    return f"{step['name']} {step['done']}"


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        jobs = server.get("/api/jobs", timeout=30)["jobs"]
    else:
        from app.core.jobs import read_finished

        jobs = read_finished(ctx.paths.home / "jobs.json")
    if args.json:
        print(json.dumps(jobs, indent=2))
        return EXIT_OK
    if server is None:
        print("no server is running: the finished jobs the last one saved")
    if not jobs:
        print("no jobs")
        return EXIT_OK
    rows = [["ID", "KIND", "STATE", "PROGRESS", "STARTED", "TITLE"]]
    for j in jobs:
        title = j["title"] + (f" ({j['error']})" if j.get("error") else "")
        rows.append([j["id"], j["kind"], j["state"], _progress(j), _age(j.get("started")), title])
    table(rows, pad_last=False)
    return EXIT_OK


def _follow(args: argparse.Namespace, ctx: CliContext) -> int:
    server = needed_server(args, ctx, what="following a job")
    last: dict[str, Any] = {}
    for kind, data in server.events(f"/api/jobs/{args.id}/events", timeout=3600):
        if not isinstance(data, dict) or "state" not in data:
            continue
        last = data
        if args.json:
            print(json.dumps({"event": kind, **data}), flush=True)
        else:
            print(f"{data['state']:<9} {_progress(data)}  {data['title']}", flush=True)
    if not last:
        raise SwitchyardError(f"the server sent nothing about job {args.id}; see `switchyard jobs`")
    if last.get("error") and not args.json:
        print(f"error: {last['error']}")
    return EXIT_OK if last["state"] == "completed" else EXIT_FAILED


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.action is None:
        return _list(args, ctx)
    if not args.id:
        raise SwitchyardError(
            f"say which job: `switchyard jobs {args.action} ID` (`switchyard jobs` lists them)"
        )
    if args.action == "follow":
        return _follow(args, ctx)
    job = needed_server(args, ctx, what="cancelling a job").call("DELETE", f"/api/jobs/{args.id}")
    print(json.dumps(job, indent=2) if args.json else f"{job['id']}: {job['state']}")
    return EXIT_OK
