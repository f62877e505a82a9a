"""`switchyard explain MODEL`: which lane would run a model, why, and whether it fits.

Asked of the running server when one answers (it knows what is loaded), else evaluated here; flags that
change the evaluation (context, slots, KV type, GPU layers, models folders) are always evaluated here.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from pathlib import Path
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, models_dir_arg
from app.core.errors import ServerNotRunningError
from app.core.settings import KV_TYPES

_EVAL_FLAGS = ("ctx_size", "parallel", "kv_type", "gpu_layers")


def register(sub: Subparsers) -> None:
    ex = sub.add_parser("explain", help="which lane would run a model, why, and whether it fits")
    ex.add_argument("model", help="a model id from `switchyard ls`, or a path to a model file or folder")
    models_dir_arg(ex)
    ex.add_argument("--ctx-size", type=int, help="evaluate at this total context")
    ex.add_argument("--parallel", type=int, help="evaluate with this many slots")
    ex.add_argument("--kv-type", choices=KV_TYPES, help="evaluate with this KV cache type")
    ex.add_argument("--gpu-layers", type=int, help="evaluate this many GPU layers instead of searching")
    ex.add_argument(
        "--across",
        metavar="PEER[,PEER]",
        help="plan this model over this machine and these paired peers: a GGUF split (llama.cpp RPC), or a "
        "safetensors model on vLLM/SGLang, one process per machine (asks the running server)",
    )
    ex.add_argument("--url", help="ask this running server (default: the one recorded, if it answers)")
    ex.add_argument("--local", action="store_true", help="do not ask a running server")
    api_key_arg(ex)
    ex.add_argument("--json", action="store_true", help="machine-readable output")


def _local(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    from app.advice.explain import explain_local

    # flags given to explain are about this model: they win over its model_overrides entry
    flags = {k: getattr(args, k) for k in _EVAL_FLAGS}
    flags = {k: v for k, v in flags.items() if v is not None}
    found = explain_local(args.model, settings=ctx.settings(args), paths=ctx.paths, overrides=flags)
    return found.public()


def _asked(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any] | None:
    if args.across:  # peers are the running server's: only it can plan across them
        server = ctx.server(args.url, api_key=args.api_key)
        query = urllib.parse.urlencode({"across": args.across})
        return dict(server.get(f"/api/models/{args.model}/explain?{query}", timeout=60))
    if args.local or Path(args.model).expanduser().exists():
        return None
    if any(getattr(args, k, None) is not None for k in _EVAL_FLAGS) or args.models_dirs:
        return None  # the server explains with its own settings; evaluate these here
    server = ctx.server(args.url, api_key=args.api_key)
    try:
        return dict(server.get(f"/api/models/{args.model}/explain", timeout=30))
    except ServerNotRunningError:
        if args.url:  # asked for that server by name: say it did not answer rather than guess
            raise
        return None
    except ValueError as exc:  # something answered, but not with JSON
        if args.url:
            raise ServerNotRunningError(f"no Switchyard server answers at {server.url} ({exc})") from exc
        return None


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.advice.explain import render

    doc = _asked(args, ctx) or _local(args, ctx)
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0
