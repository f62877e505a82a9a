"""`switchyard pin MODEL [LANE] [--clear]`: always run a model on one lane, refused if it cannot."""

from __future__ import annotations

import argparse

from app.cli.context import CliContext
from app.cli.options import Subparsers, models_dir_arg
from app.core.errors import SettingsError


def register(sub: Subparsers) -> None:
    pin = sub.add_parser("pin", help="always run a model on one lane (refused if that lane cannot run it)")
    pin.add_argument("model", help="a model id from `switchyard ls`")
    pin.add_argument(
        "lane",
        nargs="?",
        help="the lane to run it on: llama.cpp, mistral.rs, mlx, vllm, sglang, sd.cpp, whisper.cpp, piper "
        "(without it, print the pin)",
    )
    pin.add_argument("--clear", action="store_true", help="remove the pin")
    models_dir_arg(pin)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.advice.explain import explain_pin
    from app.core.pins import PinStore

    paths = ctx.paths
    store = PinStore(paths.pins_file)
    pins = store.all()
    paths.home.mkdir(parents=True, exist_ok=True)
    if args.clear:
        removed = store.set(args.model, None)  # locked: concurrent pins are all kept
        print(f"unpinned {args.model}" if removed else f"{args.model} was not pinned")
        return 0
    if not args.lane:
        print(
            f"{args.model}: pinned to {pins[args.model]}"
            if args.model in pins
            else f"{args.model}: not pinned"
        )
        return 0
    refusal = explain_pin(args.model, args.lane, settings=ctx.settings(args), paths=paths)
    if refusal:
        raise SettingsError(f"cannot pin {args.model} to {args.lane}: {refusal}")
    store.set(args.model, args.lane)
    print(f"pinned {args.model} to {args.lane}; `switchyard explain` and the server's lane starts follow it")
    return 0
