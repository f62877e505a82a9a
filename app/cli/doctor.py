"""`switchyard doctor [versions]`: hardware, engines, models, remotes, and anything wrong with them."""

from __future__ import annotations

import argparse
import json

from app.cli import remote
from app.cli.context import CliContext
from app.cli.options import Subparsers


def register(sub: Subparsers) -> None:
    doc = sub.add_parser("doctor", help="hardware, engines and anything wrong with this machine's set-up")
    doc.add_argument(
        "view",
        nargs="?",
        choices=["versions"],
        help="versions: only the versions of Switchyard, Python, each engine and each package",
    )
    doc.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.advice.doctor import doctor, render_doctor, render_versions, versions

    if args.view == "versions":
        found = versions(settings=ctx.base_settings())
        print(json.dumps(found, indent=2) if args.json else render_versions(found))
        return 0
    # remote lanes: asked of the running server, else checked from here
    rows = remote.doctor_rows(ctx.paths, cacert=ctx.cacert)
    report = doctor(ctx.paths, settings=ctx.base_settings(), remotes=rows)
    print(json.dumps(report, indent=2) if args.json else render_doctor(report))
    return 1 if any(p["level"] == "error" for p in report["problems"]) else 0
