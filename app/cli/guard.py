"""`switchyard guard`: the safety judges (docs/safety.md) — enable one known guard model (pulled through
the normal pull path, then written into `policy`), disable the policy, or show it.

Settings go through the running server (which applies them at once) when one runs, else into
settings.json.
"""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import BadRequestError
from app.safety.known import KNOWN, KnownJudge


def register(sub: Subparsers) -> None:
    g = sub.add_parser("guard", help="safety judges: enable a guard model, disable the policy, show it")
    verbs = g.add_subparsers(dest="guard_command", metavar="enable|disable|status")
    e = verbs.add_parser("enable", help="pull a known guard model and make it the policy's judge")
    e.add_argument("name", choices=sorted(KNOWN), help="which guard model")
    e.add_argument("--judge", choices=("request", "answer", "both"), default="request", help="what it judges")
    e.add_argument(
        "--fail", choices=("open", "closed"), default="open", help="when no judge answers: pass or refuse"
    )
    e.add_argument("--no-pull", action="store_true", help="do not download (the model is here already)")
    e.add_argument("--local", action="store_true", help="download in this process even if a server runs")
    verbs.add_parser("disable", help="turn the policy off (its judges are kept for the next enable)")
    verbs.add_parser("status", help="the policy, and the latest verdicts when a server runs")
    g.set_defaults(url=None, api_key=None)  # `switchyard guard` alone is status
    for p in verbs.choices.values():
        p.add_argument("--url", help="server address (default: the one the running server recorded)")
        api_key_arg(p)


def _policy(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    return dict(ctx.setting(args, "policy") or {})


def _write(args: argparse.Namespace, ctx: CliContext, values: dict[str, Any]) -> None:
    ctx.change_settings(args, values, origin="switchyard guard")


def _pull(args: argparse.Namespace, ctx: CliContext, judge: KnownJudge) -> int:
    from app.cli.pull import cmd_pull

    pull_args = argparse.Namespace(
        ref=f"{judge.repo}:{judge.quant}",
        revision=None,
        mmproj="none",
        url=args.url,
        api_key=args.api_key,
        local=args.local,
        detach=False,
    )
    return cmd_pull(pull_args, ctx)


def _enable(args: argparse.Namespace, ctx: CliContext) -> int:
    judge = KNOWN[args.name]
    if not args.no_pull and (code := _pull(args, ctx, judge)) != 0:
        return code
    policy = _policy(args, ctx)
    others = [j for j in policy.get("judges", []) if j.get("model") != judge.model]
    policy.update(
        enabled=True,
        judge=args.judge,
        fail=args.fail,
        judges=[{"model": judge.model, "format": judge.format}, *others],
    )
    # no max_loaded_lanes to raise: a judge's lane has a pool of its own beside the text lane
    values: dict[str, Any] = {"policy": policy}
    _write(args, ctx, values)
    print(f"safety policy on: {judge.model} ({judge.format}) judges each {args.judge}; fail {args.fail}")
    return 0


def _status(args: argparse.Namespace, ctx: CliContext) -> int:
    policy = _policy(args, ctx)
    if not policy:
        print("no safety policy: `switchyard guard enable qwen3guard-0.6b` sets one")
        return 0
    state = "on" if policy.get("enabled") else "off"
    print(
        f"safety policy {state}: judges {policy.get('judge', 'request')}, fail {policy.get('fail', 'open')},"
        f" controversial counts as {policy.get('controversial', 'safe')}"
    )
    rows = [("JUDGE", "FORMAT")] + [(j["model"], j["format"]) for j in policy.get("judges", [])]
    if len(rows) > 1:
        table(rows)
    server = ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        audit = server.get("/api/audit?limit=10", timeout=30)
        for j in audit.get("judges", []):
            if not j["can_judge"]:
                print(f"judge {j['model']} cannot judge on the running server: {j['reason']}")
        if audit.get("enabled") and not audit.get("judging", True):
            fail = policy.get("fail", "open")
            outcome = "passes unjudged" if fail == "open" else "is refused"
            print(
                f"NOT JUDGING: no judge of the policy can run on the server: every request {outcome} "
                f"(fail {fail})"
            )
        records = audit["records"]
        if records:
            table(
                [("STAGE", "MODEL", "JUDGE", "VERDICT", "BLOCKED")]
                + [
                    (r["stage"], r["model"], r["judge"] or "-", r["verdict"], "yes" if r["blocked"] else "no")
                    for r in records
                ]
            )
    return 0


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    verb = getattr(args, "guard_command", None)
    if verb == "enable":
        return _enable(args, ctx)
    if verb == "disable":
        policy = _policy(args, ctx)
        if not policy.get("enabled"):
            print("the safety policy is off already")
            return 0
        _write(args, ctx, {"policy": {**policy, "enabled": False}})
        print("safety policy off; `switchyard guard enable NAME` turns it on again")
        return 0
    if verb in (None, "status"):
        return _status(args, ctx)
    raise BadRequestError(f"unknown guard command {verb!r}; use enable, disable or status")
