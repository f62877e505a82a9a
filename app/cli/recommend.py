"""`switchyard recommend`: the curated small models per task, ranked by what fits this machine.

With a running server the hub verdicts come from it (it knows what its lanes hold); without one they are
worked out here. Either way the hub is asked once per entry, and the list's sizes stand in when it does
not answer (docs/desktop.md#first-run).
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg

TASK_CHOICES = ("chat", "coding", "embeddings", "speech")


def register(sub: Subparsers) -> None:
    rc = sub.add_parser("recommend", help="small models that suit this machine, per task, ready to pull")
    rc.add_argument("--task", choices=TASK_CHOICES, help="only this task (default: all four)")
    rc.add_argument("--url", help="ask this running server (default: the one recorded, if it answers)")
    rc.add_argument("--local", action="store_true", help="do not ask a running server")
    api_key_arg(rc)
    rc.add_argument("--json", action="store_true", help="machine-readable output")


def _server_asker(server: Any, *, hardware: Any, calibration: Any) -> Any:
    """Each entry's model page with its fit, from the running server (its errors become hub errors, so
    the entry falls back to the list's size)."""
    from app.advice.recommend import Candidate, Verdict, verdict_from_detail
    from app.core.errors import HubError, ServerAuthError, SwitchyardError

    def ask(c: Candidate) -> Verdict:
        query = urllib.parse.urlencode(
            {"card": "false", **({"quant": c.quant} if c.quant else {"fit": "false"})}
        )
        try:
            doc = server.get(f"/api/hub/models/{c.repo}?{query}", timeout=120)
        except ServerAuthError:
            raise
        except SwitchyardError as exc:
            raise HubError(exc.message) from exc
        return verdict_from_detail(c, doc, hardware=hardware, calibration=calibration)

    return ask


def _rows(doc: dict[str, Any]) -> list[str]:
    from app.advice.hub_fit import VERDICT_WORDS
    from app.advice.recommend import predicted_words
    from app.core.units import fmt_bytes

    lines: list[str] = []
    if doc.get("hub_problem"):
        lines.append(f"note: {doc['hub_problem']}; verdicts come from the list's sizes\n")
    for task, recs in doc["tasks"].items():
        lines.append(task)
        for i, r in enumerate(recs, 1):
            speed = predicted_words(r)
            name = r["pull"][0] + (" [vision]" if r["vision"] else "")
            verdict = VERDICT_WORDS.get(r["verdict"] or "", "unknown")
            lines.append(
                f"  {i}. {name:<55} {fmt_bytes(r['size']):>10}  {verdict:<20} {speed:<38} {r['why']}"
            )
        best = recs[0] if recs and recs[0]["fits"] is not False else None
        pace = (doc.get("pace") or {}).get(task)
        if pace:
            lines.append(f"     {pace}")
        if best:
            pull = " && ".join(f"switchyard pull {p}" for p in best["pull"])
            lines.append(("     if slow answers will do, pull it: " if pace else "     pull it: ") + pull)
        else:
            lines.append("     none of these fits here")
        lines.append("")
    return lines


def _calibrated(inputs: Any, ctx: CliContext) -> Any:
    """`inputs` with this machine's speed calibration from library.db (the speeds its answers measured),
    so the predictions are the ones the window and a running server give."""
    import dataclasses

    from app.fit.plan import device_bandwidths
    from app.lanes.engines.registry import calibrating_lanes
    from app.library.speeds import machine_calibration
    from app.library.store import Library

    bws = device_bandwidths(inputs.hardware)  # per device: a card's own, the CPU's measured copy figure
    if not bws:
        return inputs
    library = Library.open(ctx.paths)
    try:
        speed = machine_calibration(library, bandwidth=bws, lanes=calibrating_lanes())
        return dataclasses.replace(inputs, speed=speed)
    finally:
        library.close()


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.advice.inputs import local_inputs
    from app.advice.recommend import capped, hub_asker, recommend
    from app.hub.browse import Hub

    settings = ctx.settings(args)
    inputs = _calibrated(local_inputs(settings, ctx.paths), ctx)
    server = None if args.local else ctx.running(args.url, api_key=args.api_key)
    if server is not None:
        ask = _server_asker(server, hardware=capped(inputs.hardware, settings), calibration=inputs.speed)
    else:
        ask = hub_asker(Hub(ctx.paths, settings).client(), inputs=inputs)
    found = recommend(inputs, ask=ask, task=args.task).public()
    print(json.dumps(found, indent=2) if args.json else "\n".join(_rows(found)).rstrip())
    return 0
