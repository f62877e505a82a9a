"""`switchyard gate`: standing update gates — a model's next `switchyard update` is scored by a suite and
switched only if it reaches the pass mark (docs/evals.md#update-gates).

Kept in settings.json under `gates`; through the running server (which applies it at once) when one runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import BadRequestError


def register(sub: Subparsers) -> None:
    g = sub.add_parser(
        "gate", help="set, clear or list standing update gates (an eval suite a new revision must pass)"
    )
    g.add_argument("model", nargs="?", help="the model (default: list every gate)")
    g.add_argument("suite", nargs="?", help="a built-in suite name or a suite file")
    g.add_argument("min_score", nargs="?", type=float, help="the pass mark, from 0 to 1")
    g.add_argument("--off", action="store_true", help="remove the model's gate")
    g.add_argument("--url", help="server address (default: the one the running server recorded)")
    api_key_arg(g)


def _gates(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    return dict(ctx.setting(args, "gates") or {})


def _write(args: argparse.Namespace, ctx: CliContext, gates: dict[str, Any]) -> None:
    ctx.change_settings(args, {"gates": gates}, origin="switchyard gate")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    gates = _gates(args, ctx)
    if args.model is None:
        if not gates:
            print("no update gates: `switchyard gate MODEL SUITE MIN_SCORE` sets one")
            return 0
        table(
            [("MODEL", "SUITE", "MIN SCORE")]
            + [(m, g["suite"], f"{g['min_score']:g}") for m, g in gates.items()]
        )
        return 0
    if args.off:
        if gates.pop(args.model, None) is None:
            print(f"{args.model} has no gate")
            return 0
        _write(args, ctx, gates)
        print(f"{args.model}: gate removed; `switchyard update` switches it without an eval")
        return 0
    if args.suite is None or args.min_score is None:
        raise BadRequestError("give the suite and the pass mark: `switchyard gate MODEL SUITE MIN_SCORE`")
    if not 0 <= args.min_score <= 1:
        raise BadRequestError("the pass mark is a number from 0 to 1 (0.8 means 80 %)")
    from app.quality.suite import load_suite, placed_suite

    # the server reads suites only from its suites folder: a file from elsewhere is copied there
    suite = placed_suite(args.suite, folder=ctx.paths.suites)
    load_suite(suite, folder=ctx.paths.suites)  # refused now, not at the next update
    _check_updatable(args.model, ctx.paths, ctx.settings(args))
    gates[args.model] = {"suite": suite, "min_score": args.min_score}
    _write(args, ctx, gates)
    mark = f"{args.min_score:g}"
    print(f"{args.model}: `switchyard update` now switches only if {args.suite} scores at least {mark}")
    return 0


def _check_updatable(model: str, paths: Any, settings: Any) -> None:
    """A gate is for a model `switchyard update` can change: one pulled from the hub (by its id, alias or
    repository). Refused otherwise, saying why, before anything is written."""
    from app.core.errors import ModelNotFoundError
    from app.library.opening import opened_catalog

    with opened_catalog(settings, paths) as (_, catalog):
        try:
            entry = catalog.get(model, allow_broken=True)
        except ModelNotFoundError:
            entries = catalog.scan()
            if any(e.origin is not None and e.origin.repo == model for e in entries):
                return  # a pulled repository, named as such
            raise BadRequestError(
                f"no model {model!r} in the library: a gate is for a model you pulled; `switchyard ls` "
                "lists the ids (and `switchyard pull REPO` fetches one)",
                param="model",
            ) from None
    if entry.origin is None:
        raise BadRequestError(
            f"{model!r} is not from Hugging Face (source {entry.source}: {entry.path}), so `switchyard "
            "update` can never change it and a gate would never run; gates are for models pulled with "
            "`switchyard pull`",
            param="model",
        )
