"""`switchyard serve`: the server headless, in the foreground, until SIGTERM, SIGINT or SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from app.cli.context import CliContext
from app.cli.options import Subparsers, models_dir_arg
from app.core.errors import SettingsError
from app.core.settings import DEFAULT_PORT, FLASH_ATTN, KV_TYPES, RUNTIMES


def register(sub: Subparsers) -> None:
    s = sub.add_parser("serve", help="run the server headless (no window)")
    s.add_argument("--host", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS: tls_cert/tls_key from settings, else a self-signed certificate under the data dir "
        "(required for a non-loopback --host unless allow_plain_lan is set)",
    )
    models_dir_arg(s)
    s.add_argument(
        "--max-loaded", type=int, dest="max_loaded_lanes", help="generation lanes loaded at once (default 1)"
    )
    s.add_argument(
        "--ttl",
        type=float,
        dest="idle_ttl_s",
        help="seconds idle before a lane is unloaded (default 900; 0 never)",
    )
    s.add_argument("--ctx-size", type=int, help="total context per lane (0: automatic)")
    s.add_argument("--parallel", type=int, help="parallel slots per lane (default 4)")
    s.add_argument("--threads", type=int, help="CPU threads per lane (0: the cores this process may use)")
    s.add_argument("--kv-type", choices=KV_TYPES, help="KV cache type (default f16)")
    s.add_argument("--flash-attn", choices=FLASH_ATTN, help="flash attention (default auto)")
    s.add_argument("--gpu-layers", type=int, help="layers on the GPU (-1: automatic)")
    s.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="llama.cpp runtime (default auto: docker, podman, bin, path, xllamacpp, as runtime_order says)",
    )
    s.add_argument("--llama-server", dest="llama_server_path", help="path of a llama-server binary")
    s.add_argument(
        "--llama-cpp-version",
        dest="llama_cpp_version",
        metavar="TAG",
        help="the llama.cpp release runtime bin runs (a tag such as b7400, or latest; default: the pin)",
    )
    s.add_argument(
        "--pull-only",
        action="store_true",
        help="fetch the engine releases the configured runtimes need, then exit (no server)",
    )
    s.add_argument(
        "--sd-server", dest="sd_server_path", help="path of a stable-diffusion.cpp sd-server binary"
    )
    s.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="how much the server logs to stderr: debug, info (default), warning or error",
    )


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (auto) or asked for: its C transports halve the gateway's CPU per streamed
    chunk, which on a small machine is CPU the engine does not get."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise SettingsError(
                "event_loop 'uvloop' is selected but uvloop is not installed: pip install uvloop"
            ) from exc
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.server.app import serve

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings = ctx.settings(args)
    if args.pull_only:
        from app.hardware.probe import probe
        from app.lanes.install.runtimes import pull_only

        for line in pull_only(settings, probe(bandwidth_cache=ctx.paths.hardware_cache)):
            print(line)
        return 0
    with asyncio.Runner(loop_factory=loop_factory(settings.server.event_loop)) as runner:
        runner.run(serve(settings, ctx.paths, use_tls=bool(getattr(args, "tls", False))))
    return 0


def run_defaults(ctx: CliContext) -> int:
    """`serve` with every option at its default (the GUI's fallback when it cannot open a window)."""
    parser = argparse.ArgumentParser(prog="switchyard")
    register(parser.add_subparsers(dest="command"))
    return run(parser.parse_args(["serve"]), ctx)
