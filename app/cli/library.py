"""`switchyard ls`, `switchyard import PATH [--link] [--name ID]` and `switchyard rm MODEL [--delete-files]`.

`rm` asks the running server (app/cli/client.py finds it) when there is one, so a model that a
lane has loaded is refused with the lane named; with no server it works on library.db directly.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from app.cli import remote
from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, models_dir_arg, table
from app.core.units import fmt_bytes

T = TypeVar("T")
# the catalog is imported where used (app.library.opening): it pulls in numpy, which other commands skip


def register(sub: Subparsers) -> None:
    ls = sub.add_parser("ls", help="list the models in the library")
    models_dir_arg(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument(
        "--origin", action="store_true", help="show where each model came from (app, hub repository, folder)"
    )
    imp = sub.add_parser("import", help="add a local model file or folder to the library (copied, or --link)")
    imp.add_argument(
        "path", type=Path, help="a model file (.gguf, whisper .bin, piper .onnx) or a model folder"
    )
    imp.add_argument("--link", action="store_true", help="register it where it is instead of copying it")
    imp.add_argument("--name", help="the model id to give it (default: the file or folder name)")
    models_dir_arg(imp)
    rm = sub.add_parser("rm", help="remove a model from the library (refused while a lane has it loaded)")
    rm.add_argument("model", help="a model id from `switchyard ls` (or an org/repo:QUANT alias)")
    rm.add_argument(
        "--delete-files",
        action="store_true",
        help="also delete your own file (a model in a models folder, or a linked import)",
    )
    rm.add_argument("--url", help="server address (default: the one the running server recorded)")
    api_key_arg(rm)
    models_dir_arg(rm)


def _size(n: int) -> str:
    return fmt_bytes(n) if n > 0 else "-"


def cmd_ls(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.library.listing import listing
    from app.library.opening import opened_catalog

    settings = ctx.settings(args)
    with opened_catalog(settings, ctx.paths) as (library, catalog):
        models = listing(library, catalog, settings)
    dirs = [str(d) for d in catalog.dirs]
    remote_models = remote.remote_models(ctx.paths)  # NAME/MODEL of each remote (docs/engines.md)
    if args.json:
        doc = {
            "library": str(library.path),
            "dirs": dirs,
            "hf_cache": str(catalog.hf_cache),
            "models": models,
            "remote_models": remote_models,
        }
        print(json.dumps(doc, indent=2))
        return 0
    if models and args.origin:
        table([("ID", "FROM", "WHERE")] + [(m["id"], *origin_of(m)) for m in models])
        return 0
    if not models:
        print(
            f"no models in {', '.join(dirs)} or the Hugging Face cache {catalog.hf_cache} — put .gguf files "
            "there, `switchyard import PATH`, or `switchyard pull REPO`"
        )
    else:
        rows = [("ID", "FORMAT", "KIND", "SIZE", "SOURCE", "ORIGIN", "SMOKE", "STATUS")]
        for m in models:
            o = m["origin"]
            origin = (f"{o['repo']}@{o['commit'][:7]}" if o["commit"] else o["repo"]) if o else "-"
            if (st := m.get("starter")) is not None:  # a package, not a hub repository: its license too
                origin = f"{st['package']} {st['version'] or ''} ({st['license'] or 'license unknown'})"
            status = m["status"] if m["status"] == "ok" else f"{m['status']}: {m['problem']}"
            kind = f"{m['kind']}+vision" if m.get("vision") else m["kind"]  # a projector loads with it
            smoke = "-" if not m["smoke"] else ("passed" if m["smoke"]["ok"] else "FAILED")
            rows.append((m["id"], m["format"], kind, _size(m["size"]), m["source"], origin, smoke, status))
        table(rows)
        for m in models:  # why, for each model whose smoke test failed (docs/library.md#smoke-tests)
            if m["smoke"] and not m["smoke"]["ok"]:
                print(f"{m['id']}: smoke test failed: {m['smoke']['detail']}")
    if remote_models:
        print()
        table(
            [("REMOTE MODEL", "KIND", "URL")] + [(m["id"], m["kind"] or "-", m["url"]) for m in remote_models]
        )
    return 0


def origin_of(model: dict[str, Any]) -> tuple[str, str]:
    """(who put the model there, where its files are) for `ls --origin`."""
    from app.library.app_stores.locations import APP_NAMES

    owner, origin = model.get("owner"), model.get("origin")
    if owner:
        app = APP_NAMES.get(owner["app"], owner["app"])
        label = f"{app} ({owner['name']}), read-only" if owner["app"] != "folder" else f"{app}, read-only"
        return label, model["path"]
    if origin:
        commit = f"@{origin['commit'][:7]}" if origin.get("commit") else ""
        return f"Hugging Face {origin['repo']}{commit}", model["path"]
    labels = {
        "models_dir": "models folder",
        "import_copy": "imported (copied)",
        "import_link": "imported (linked)",
        "starter": "starter model package",
        "alias": "another name",
    }
    return labels.get(model["source"], model["source"]), model["path"]


def _on_library(
    args: argparse.Namespace, ctx: CliContext, act: Callable[..., T], model: Any, **flags: Any
) -> T:
    """`act(model, ...)` on this data folder's library and catalog, opened for the call and closed after:
    the changes `import` and `rm` make without a server."""
    from app.library.opening import opened_catalog

    with opened_catalog(ctx.settings(args), ctx.paths) as (library, catalog):
        return act(model, catalog=catalog, library=library, imported_root=ctx.paths.imported, **flags)


def cmd_import(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.library.importer import import_model

    entry = _on_library(args, ctx, import_model, args.path, link=args.link, name=args.name)
    how = f"linked in place at {entry.path}" if args.link else f"copied to {entry.location}"
    print(f"imported {entry.id} ({entry.format}, {entry.kind}, {_size(entry.size)}): {how}")
    if not entry.ok:
        print(f"note: {entry.public()['problem']}", file=sys.stderr)
    return 0


def _remote_rm(server: ServerClient, model: str, *, delete_files: bool) -> dict[str, Any]:
    q = "?delete_files=true" if delete_files else ""
    path = f"/api/library/{urllib.parse.quote(model, safe='/:')}{q}"
    return dict(server.call("DELETE", path, timeout=60))  # a loaded model: ModelInUseError, exit 2


def cmd_rm(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.library.remove import remove_model

    server = ctx.running(args.url, api_key=args.api_key)  # a stale server.json: work on the file directly
    if server is not None:
        done = _remote_rm(server, args.model, delete_files=args.delete_files)
    else:
        done = _on_library(args, ctx, remove_model, args.model, delete_files=args.delete_files).public()
    if done["action"] == "unregistered":
        print(f"unregistered {done['id']}; your file is kept: {', '.join(done['kept'])}")
    else:
        print(f"removed {done['id']} ({done['source']}): deleted {len(done['deleted'])} file(s)")
        for p in done["deleted"]:
            print(f"  {p}")
    return 0


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    commands = {"ls": cmd_ls, "import": cmd_import, "rm": cmd_rm}
    return commands[args.command](args, ctx)
