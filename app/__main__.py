"""The `switchyard` command line: gui (default), serve, ls, ps, version.

The GUI is imported lazily, so every headless command runs without Qt installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app import __version__, cli_engines, cli_hub, cli_keys, cli_library, cli_pull, cli_remote
from app.core.errors import ServerNotRunningError, SettingsError, SwitchyardError
from app.core.paths import Paths
from app.core.settings import DEFAULT_PORT, FLASH_ATTN, KV_TYPES, RUNTIMES, Settings, load_settings


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="switchyard", description="Local AI models behind one OpenAI-compatible endpoint."
    )
    ap.add_argument("--version", action="version", version=f"switchyard {__version__}")
    sub = ap.add_subparsers(dest="command")

    s = sub.add_parser("serve", help="run the server headless (no window)")
    s.add_argument("--host", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS: tls_cert/tls_key from settings, else a self-signed certificate under the data dir "
        "(required for a non-loopback --host unless allow_plain_lan is set)",
    )
    _models_dir_arg(s)
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
        "--runtime", choices=RUNTIMES, help="llama.cpp runtime (default auto: xllamacpp, then llama-server)"
    )
    s.add_argument("--llama-server", dest="llama_server_path", help="path of a llama-server binary")
    s.add_argument(
        "--sd-server", dest="sd_server_path", help="path of a stable-diffusion.cpp sd-server binary"
    )
    s.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="how much the server logs to stderr: debug, info (default), warning or error",
    )

    ls = sub.add_parser("ls", help="list the models in the library")
    _models_dir_arg(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")

    ps = sub.add_parser("ps", help="show the lanes of the running server")
    ps.add_argument("--url", help="server address (default: the one the running server recorded)")
    ps.add_argument("--json", action="store_true", help="machine-readable output")
    ps.add_argument("--api-key", help="key for a server that requires one (default: $SWITCHYARD_API_KEY)")

    ex = sub.add_parser("explain", help="which lane would run a model, why, and whether it fits")
    ex.add_argument("model", help="a model id from `switchyard ls`, or a path to a model file or folder")
    _models_dir_arg(ex)
    ex.add_argument("--ctx-size", type=int, help="evaluate at this total context")
    ex.add_argument("--parallel", type=int, help="evaluate with this many slots")
    ex.add_argument("--kv-type", choices=KV_TYPES, help="evaluate with this KV cache type")
    ex.add_argument("--gpu-layers", type=int, help="evaluate this many GPU layers instead of searching")
    ex.add_argument("--url", help="ask this running server (default: the one recorded, if it answers)")
    ex.add_argument("--local", action="store_true", help="do not ask a running server")
    ex.add_argument("--api-key", help="key for a server that requires one (default: $SWITCHYARD_API_KEY)")
    ex.add_argument("--json", action="store_true", help="machine-readable output")

    doc = sub.add_parser("doctor", help="hardware, engines and anything wrong with this machine's set-up")
    doc.add_argument(
        "view",
        nargs="?",
        choices=["versions"],
        help="versions: only the versions of Switchyard, Python, each engine and each package",
    )
    doc.add_argument("--json", action="store_true", help="machine-readable output")

    pin = sub.add_parser("pin", help="always run a model on one lane (refused if that lane cannot run it)")
    pin.add_argument("model", help="a model id from `switchyard ls`")
    pin.add_argument(
        "lane",
        nargs="?",
        help="the lane to run it on: llama.cpp, mistral.rs, mlx, vllm, sglang, sd.cpp, whisper.cpp, piper "
        "(without it, print the pin)",
    )
    pin.add_argument("--clear", action="store_true", help="remove the pin")
    _models_dir_arg(pin)

    cli_keys.register(sub)
    cli_pull.register(sub)
    cli_library.register(sub)
    cli_hub.register(sub)
    cli_remote.register(sub)
    cli_engines.register(sub)
    sub.add_parser("version", help="print the version")
    sub.add_parser("gui", help="open the desktop window (default)")
    return ap


def _models_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        dest="models_dirs",
        metavar="DIR",
        help="folder of models (repeatable; default $SWITCHYARD_HOME/models)",
    )


def _settings(args: argparse.Namespace, paths: Paths) -> Settings:
    base = load_settings(paths.settings_file)
    keys = (
        "host",
        "port",
        "max_loaded_lanes",
        "idle_ttl_s",
        "ctx_size",
        "parallel",
        "threads",
        "kv_type",
        "flash_attn",
        "gpu_layers",
        "runtime",
        "llama_server_path",
        "sd_server_path",
    )
    changes: dict[str, Any] = {k: getattr(args, k, None) for k in keys}
    if getattr(args, "models_dirs", None):
        changes["models_dirs"] = tuple(p.expanduser().resolve() for p in args.models_dirs)
    return base.with_changes(**changes)


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
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


def cmd_serve(args: argparse.Namespace, paths: Paths) -> int:
    from app.server.app import serve

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings = _settings(args, paths)
    with asyncio.Runner(loop_factory=_loop_factory(settings.event_loop)) as runner:
        runner.run(serve(settings, paths, use_tls=bool(getattr(args, "tls", False))))
    return 0


def cmd_ls(args: argparse.Namespace, paths: Paths) -> int:
    return cli_library.cmd_ls(args, paths, _settings(args, paths))  # app/cli_library.py


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def _server_url(args: argparse.Namespace, paths: Paths) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    try:
        return str(json.loads(paths.server_file.read_text())["url"])
    except (OSError, ValueError, KeyError):
        settings = load_settings(paths.settings_file)
        return f"http://{settings.host}:{settings.port}"


def cmd_ps(args: argparse.Namespace, paths: Paths) -> int:
    from app import remote

    url = _server_url(args, paths)
    try:
        lanes = remote.get_json(url, "/api/lanes", key=remote.api_key(args.api_key), timeout=5)["lanes"]
    except (urllib.error.URLError, OSError) as exc:
        raise remote.not_running(url, exc) from exc
    try:  # remote lanes (app/cli_remote.py); an older server has no /api/remotes
        remotes = remote.get_json(url, "/api/remotes", key=remote.api_key(args.api_key), timeout=5)["remotes"]
    except (urllib.error.URLError, OSError, SwitchyardError):
        remotes = []
    if args.json:
        print(json.dumps({"url": url, "lanes": lanes, "remotes": remotes}, indent=2))
        return 0
    if not lanes:
        print(f"server at {url}: no lanes yet (a lane starts when a request names its model)")
    else:
        rows = [("MODEL", "STATE", "PID", "PORT", "IN-FLIGHT", "ERROR")]
        for ln in lanes:
            rows.append(
                (
                    ln["model"],
                    ln["state"],
                    str(ln["pid"] or "-"),
                    str(ln["port"] or "-"),
                    str(ln["in_flight"]),
                    (ln["error"] or "")[:120],
                )
            )
        _table(rows)
    if remotes:
        print("remotes:")
        cli_remote.print_table(remotes)
    return 0


def _local_explain(args: argparse.Namespace, paths: Paths) -> dict[str, Any]:
    from app.advice.explain import explain_local

    # flags given to explain are about this model: they win over its model_overrides entry
    flags = {k: getattr(args, k) for k in ("ctx_size", "parallel", "kv_type", "gpu_layers")}
    flags = {k: v for k, v in flags.items() if v is not None}
    found = explain_local(args.model, settings=_settings(args, paths), paths=paths, overrides=flags)
    return found.public()


def _remote_explain(args: argparse.Namespace, paths: Paths) -> dict[str, Any] | None:
    if args.local or Path(args.model).expanduser().exists():
        return None
    overrides = any(
        getattr(args, k, None) is not None for k in ("ctx_size", "parallel", "kv_type", "gpu_layers")
    )
    if overrides or args.models_dirs:
        return None  # the server explains with its own settings; evaluate these here
    from app import remote

    url = _server_url(args, paths)
    try:
        path = f"/api/models/{args.model}/explain"
        return dict(remote.get_json(url, path, key=remote.api_key(args.api_key), timeout=30))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if args.url:  # asked for that server by name: say it did not answer rather than guess
            raise ServerNotRunningError(f"no Switchyard server answers at {url} ({exc})") from exc
        return None


def cmd_explain(args: argparse.Namespace, paths: Paths) -> int:
    from app.advice.explain import render

    doc = _remote_explain(args, paths) or _local_explain(args, paths)
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    from app.advice.doctor import doctor, render_doctor, render_versions, versions

    if args.view == "versions":
        found = versions(settings=load_settings(paths.settings_file))
        print(json.dumps(found, indent=2) if args.json else render_versions(found))
        return 0
    # remote lanes: asked of the running server, else checked from here
    report = doctor(paths, settings=load_settings(paths.settings_file), remotes=cli_remote.doctor_rows(paths))
    print(json.dumps(report, indent=2) if args.json else render_doctor(report))
    return 1 if any(p["level"] == "error" for p in report["problems"]) else 0


def cmd_pin(args: argparse.Namespace, paths: Paths) -> int:
    from app.advice.explain import explain_pin
    from app.core.pins import PinStore

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
    settings = _settings(args, paths)
    refusal = explain_pin(args.model, args.lane, settings=settings, paths=paths)
    if refusal:
        raise SettingsError(f"cannot pin {args.model} to {args.lane}: {refusal}")
    store.set(args.model, args.lane)
    print(f"pinned {args.model} to {args.lane}; `switchyard explain` and the server's lane starts follow it")
    return 0


def _has_display() -> bool:
    import os

    if sys.platform in ("win32", "darwin") or os.environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def cmd_gui(args: argparse.Namespace, paths: Paths) -> int:
    why = None
    try:
        from app.ui.main import run_gui  # app/ui: the only package that imports Qt (docs/desktop.md)
    except ImportError:
        why = "the desktop window is not installed (pip install 'switchyard[gui]')"
    if why is None and not _has_display():
        why = "no display (DISPLAY/WAYLAND_DISPLAY unset)"
    if why is not None:
        print(f"{why}; running headless: `switchyard serve`", file=sys.stderr)
        ns = _parser().parse_args(["serve"])
        return cmd_serve(ns, paths)
    return int(run_gui(paths))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths = Paths.from_env()
    from app.server.tls import install_client_trust

    install_client_trust(paths)  # every command's calls to a TLS server trust the certificate it recorded
    commands = {
        "serve": cmd_serve,
        "ls": cmd_ls,
        "ps": cmd_ps,
        "gui": cmd_gui,
        None: cmd_gui,
        "explain": cmd_explain,
        "doctor": cmd_doctor,
        "pin": cmd_pin,
        "keys": cli_keys.run,
        "pull": lambda a, p: cli_pull.cmd_pull(a, p, _settings(a, p)),
        "update": lambda a, p: cli_pull.cmd_update(a, p, _settings(a, p)),
        "search": cli_hub.run,
        "show": cli_hub.run,
        "hub": cli_hub.run,
        "engine": lambda a, p: cli_engines.run(a, p, load_settings(p.settings_file)),
        "import": lambda a, p: cli_library.cmd_import(a, p, _settings(a, p)),
        "rm": lambda a, p: cli_library.cmd_rm(a, p, _settings(a, p)),
        "remote": cli_remote.run,
    }
    try:
        if args.command == "version":
            print(f"switchyard {__version__}")
            return 0
        return commands[args.command](args, paths)
    except SwitchyardError as exc:
        print(f"switchyard: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
