"""`switchyard engine ls|install|update|pin|rollback|remove|register|unregister`: engines in environments of
their own, and a second llama.cpp build registered as the capability lane (`llama.cpp-compat`).

The commands work on the data dir directly, with or without a server running: a running server starts
new lanes with whatever is current at that moment (lanes already running keep their version), and
`remove` is refused while a lane runs from the environment. pip's output is printed as it comes.

`install` and `update` put in the build the hardware probe chooses for engines that have several
(mistral.rs, MLX); `--build` overrides it, and `ls` says when the installed build is not the chosen one.

Exit codes: 0 done (or nothing to do), 1 the install failed (the previous version is unchanged), 2 bad
input (unknown engine, bad version or build, nothing to roll back to, in use, busy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import IO, Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import EngineInstallError, EngineStateError
from app.core.events import EventBus
from app.core.settings import Settings

EXIT_OK, EXIT_FAILED = 0, 1
KIND_HELP = "an engine: piper, whisper.cpp, mlx, vllm, sglang, mistral.rs, llama.cpp, llama.cpp-compat"
BUILD_HELP = (
    "this build instead of the one the hardware probe chooses (mistral.rs: cpu, metal, cuda12, cuda13; "
    "mlx: cpu, cuda12, cuda13, metal)"
)


def register(sub: Subparsers) -> None:
    eng = sub.add_parser("engine", help="engines in their own environments: ls, install, update, pin, ...")
    es = eng.add_subparsers(
        dest="engine_command",
        metavar="{ls,install,update,pin,rollback,remove,register,unregister}",
        required=True,
    )
    ls = es.add_parser("ls", help="every engine: installed version, pinned version, path, health")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    i = es.add_parser("install", help="install an engine into its own environment (pinned version)")
    i.add_argument("kind", help=KIND_HELP)
    i.add_argument("--version", dest="engine_version", help="this version instead of the pinned one")
    i.add_argument("--build", help=BUILD_HELP)
    i.add_argument(
        "--detach", action="store_true", help="install as a job of the running server, print its id, return"
    )
    i.add_argument("--url", help="server address for --detach (default: the running one)")
    api_key_arg(i)
    u = es.add_parser("update", help="install the pinned version where the installed one differs")
    target = u.add_mutually_exclusive_group(required=True)
    target.add_argument("kind", nargs="?", help=KIND_HELP)
    target.add_argument("--all", action="store_true", help="every engine installed in its own environment")
    u.add_argument("--build", help=BUILD_HELP + "; with KIND only")
    u.add_argument(
        "--latest",
        action="store_true",
        help="also fetch upstream's newest llama.cpp release for runtime bin (verified by its digest)",
    )
    p = es.add_parser("pin", help="the version install and update use (default: the tested one)")
    p.add_argument("kind", help=KIND_HELP)
    p.add_argument("version", nargs="?", help="e.g. 1.7.0; without it, print the pin")
    p.add_argument("--clear", action="store_true", help="back to the version Switchyard tests")
    r = es.add_parser("rollback", help="switch back to the previous version (kept by each install)")
    r.add_argument("kind", help=KIND_HELP)
    rm = es.add_parser("remove", help="delete every version of an engine's environment and its pin")
    rm.add_argument("kind", help=KIND_HELP)
    reg = es.add_parser(
        "register", help="a second llama.cpp build as the capability lane, for architectures the first lacks"
    )
    reg.add_argument("kind", choices=["llama.cpp-compat"], help="the capability lane")
    build = reg.add_mutually_exclusive_group(required=True)
    build.add_argument("--python", help="an interpreter whose xllamacpp is another version (or a fork's)")
    build.add_argument("--llama-server", dest="llama_server", help="a llama-server binary (another revision)")
    unreg = es.add_parser("unregister", help="forget the registered capability build")
    unreg.add_argument("kind", choices=["llama.cpp-compat"], help="the capability lane")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.lanes.install import engine as engine_install
    from app.lanes.install.store import EngineStore, spec_for

    settings = ctx.base_settings()
    store = EngineStore(ctx.paths.engines)
    cmd = args.engine_command
    if cmd == "ls":
        return _ls(args, settings, store)
    if cmd == "install" and args.detach:
        from app.cli.jobs import start_detached

        if args.build:  # refused here as the server would, before a server is needed
            spec_for(args.kind).check_build(args.build)
        body = {
            "kind": "engine_install",
            "engine": args.kind,
            "version": args.engine_version,
            "build": args.build,  # None: the server's probe chooses; a bad one is its 400
        }
        return start_detached(args, ctx, body, what="engine install --detach")
    if cmd == "install":
        done = _install(args.kind, store, settings, version=args.engine_version, build=args.build)
        if done == EXIT_OK and _is_capability_lane(args.kind):
            _compat_survey(settings)  # its probed architectures decide which GGUFs it takes
        return done
    if cmd == "register":
        from app.lanes.engines.llamacpp import compat

        registered = compat.register(python=args.python, llama_server=args.llama_server)
        print(f"llama.cpp-compat: registered {registered.describe()}")
        _compat_survey(settings)
        return EXIT_OK
    if cmd == "unregister":
        from app.lanes.engines.llamacpp import compat

        forgot = compat.unregister()
        print("llama.cpp-compat: " + ("registration removed" if forgot else "nothing was registered"))
        return EXIT_OK
    if cmd == "update":
        return _update(args, store, settings)
    if cmd == "pin":
        spec = spec_for(args.kind)
        if args.clear or args.version:
            state = engine_install.pin(args.kind, None if args.clear else args.version, store=store)
            now = state.pinned or spec.version
            how = "pinned by you" if state.pinned else "the version Switchyard tests"
            print(f"{args.kind}: install and update now use {spec.dist} {now} ({how})")
            print(f"run `switchyard engine update {args.kind}` to install it")
        else:
            pinned = store.read(args.kind).pinned
            print(f"{args.kind}: {spec.dist} {pinned or spec.version} ({'you' if pinned else 'manifest'})")
        return EXIT_OK
    if cmd == "rollback":
        state = engine_install.rollback(args.kind, store=store)
        assert state.current is not None
        print(f"{args.kind}: rolled back to {state.current.version}; lanes started from now on use it")
        return EXIT_OK
    gone = engine_install.remove(args.kind, store=store)
    if gone:
        print(f"{args.kind}: removed {', '.join(gone)} and its environment folder")
    else:
        print(f"{args.kind}: no environment of its own to remove")
    return EXIT_OK


def _is_capability_lane(lane: str) -> bool:
    """Whether `lane`'s registered kind is the capability build's (the registry says, not its name)."""
    from app.lanes.engines.llamacpp.compat import LlamaCompatKind
    from app.lanes.engines.registry import kind_of

    return isinstance(kind_of(lane), LlamaCompatKind)


def _compat_survey(settings: Settings) -> None:
    """Ask both llama.cpp builds which architectures they load, and say what the second one adds."""
    from app.lanes.engines.llamacpp import compat

    found = compat.survey_all(settings)
    if not found.compat:
        print("llama.cpp-compat: the build answered no probe; see the log, and check it starts on its own")
        return
    loads = sum(1 for ok in found.compat.values() if ok)
    print(f"llama.cpp-compat: loads {loads} of the {len(found.compat)} GGUF architectures asked")
    if not found.default:
        print("the default llama.cpp build runs in a container and was not asked; GGUFs stay on it")
        return
    only = found.only_compat()
    if only:
        print(f"only it loads ({len(only)}): {', '.join(only)}; GGUFs of these now run on it")
    else:
        print("it loads nothing the default llama.cpp build refuses: every GGUF stays on llama.cpp")


def _ls(args: argparse.Namespace, settings: Settings, store: Any) -> int:
    from app.hardware.probe import probe
    from app.lanes.install.listing import engine_rows

    rows = engine_rows(settings, probe(bandwidth_cache=None), store=store)  # with the builds installed
    if args.json:
        print(json.dumps({"engines": rows}, indent=2))
        return EXIT_OK
    rows_out = [("KIND", "INSTALLED", "PINNED", "BUILD", "PATH", "HEALTH")]
    for r in rows:
        where = {
            "managed": "own env",
            "app": "app",
            "path": "binary",
            "container": f"container, {r['runtime']}",
            "registered": "registered",
        }.get(r["where"] or "", "")
        installed = f"{r['version'] or '?'} ({where})" if r["installed"] else "-"
        if r["previous"]:
            installed += f", previous {r['previous']}"
        pinned = f"{r['pinned']}{' (you)' if r['pinned_by'] == 'you' else ''}" if r["pinned"] else "-"
        health = "ok" if r["can_start"] else f"cannot start: {r['health']}"
        build = r.get("build") or "-"
        if r.get("build_note"):  # the installed build first, then the one this machine calls for
            build = f"{r['installed_build'] or '?'}->{build}"
        rows_out.append((r["engine"], installed, pinned, build, r["path"] or "-", r["problem"] or health))
    table(rows_out)
    for r in rows:
        if r.get("build_note"):
            print(f"{r['engine']}: {r['build_note']}")
    return EXIT_OK


def _install(kind: str, store: Any, settings: Settings, *, version: str | None, build: str | None) -> int:
    from app.lanes.install import engine as engine_install

    async def go(bus: EventBus) -> Any:
        return await engine_install.install(
            kind,
            store=store,
            bus=bus,
            version=version,
            build=build,
            engine_python=settings.engines.engine_python,
        )

    try:
        result = asyncio.run(_with_progress(go))
    except EngineInstallError as exc:
        print(f"switchyard: install failed: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    what = f"{result.version} ({result.build} build)" if result.build else result.version
    if not result.changed:
        print(f"{kind}: {what} is already installed ({result.path})")
    else:
        before = f" (previous {result.previous}, kept for `engine rollback`)" if result.previous else ""
        print(f"{kind}: {what} installed in {result.seconds:.0f} s at {result.path}{before}")
    return EXIT_OK


def _update(args: argparse.Namespace, store: Any, settings: Settings) -> int:
    from app.hardware.probe import probe
    from app.lanes.install.engine import plan
    from app.lanes.install.store import load_manifest, spec_for

    if not args.all:
        spec_for(args.kind)
        done = _install(args.kind, store, settings, version=None, build=args.build)
        return max(done, _latest(args, settings))
    if args.build:
        raise EngineStateError(
            "--build goes with one engine (update KIND --build B), not --all", param="build"
        )
    status = EXIT_OK
    hardware = probe(engine=False)
    for lane, spec in load_manifest().items():
        state = store.read(lane)
        if state.current is None:
            continue
        want = plan(spec, state, hardware=hardware)
        if (state.current.version, state.current.build) == (want.version, want.build):
            print(f"{lane}: {want.version} is up to date")
            continue
        status = max(status, _install(lane, store, settings, version=None, build=None))
    return max(status, _latest(args, settings))


def _latest(args: argparse.Namespace, settings: Settings) -> int:
    """`--latest`: upstream's newest llama.cpp release fetched and verified for runtime bin."""
    if not args.latest:
        return EXIT_OK
    from app.hardware.probe import probe
    from app.lanes.install.runtimes import pull_only

    for line in pull_only(settings, probe(), tag="latest"):
        print(line)
    if settings.llamacpp.llama_cpp_version != "latest":
        print('runtime bin keeps its pinned release until llama_cpp_version is "latest" in settings.json')
    return EXIT_OK


async def _with_progress(go: Callable[[EventBus], Awaitable[Any]], *, out: IO[str] | None = None) -> Any:
    """Run `go` while printing its engine.progress events as they come (to `out`, else stdout as it is
    now: a redirected stdout gets them too)."""
    out = out or sys.stdout
    bus = EventBus()
    async with bus.subscribe() as q:
        task = asyncio.ensure_future(go(bus))
        while True:
            getter = asyncio.ensure_future(q.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                while not q.empty():
                    _print(q.get_nowait().data, out)
                return task.result()
            ev = getter.result()
            if ev.kind == "engine.progress":
                _print(ev.data, out)


def _print(data: dict[str, Any], out: IO[str]) -> None:
    if "line" in data:
        print(f"  [{data['phase']}] {data['line']}", file=out, flush=True)
