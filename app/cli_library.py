"""`switchyard ls`, `switchyard import PATH [--link] [--name ID]` and `switchyard rm MODEL [--delete-files]`.

`rm` asks the running server (found through SWITCHYARD_HOME/server.json) when there is one, so a model that a
lane has loaded is refused with the lane named; with no server it works on library.db directly.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app import cli_remote
from app.core.errors import ModelInUseError, ServerNotRunningError, SwitchyardError
from app.core.paths import Paths
from app.core.settings import Settings
from app.core.units import fmt_bytes

# the catalog is imported where used (app.library.opening): it pulls in numpy, which other commands skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    imp = sub.add_parser("import", help="add a local model file or folder to the library (copied, or --link)")
    imp.add_argument(
        "path", type=Path, help="a model file (.gguf, whisper .bin, piper .onnx) or a model folder"
    )
    imp.add_argument("--link", action="store_true", help="register it where it is instead of copying it")
    imp.add_argument("--name", help="the model id to give it (default: the file or folder name)")
    _models_dir_arg(imp)
    rm = sub.add_parser("rm", help="remove a model from the library (refused while a lane has it loaded)")
    rm.add_argument("model", help="a model id from `switchyard ls` (or an org/repo:QUANT alias)")
    rm.add_argument(
        "--delete-files",
        action="store_true",
        help="also delete your own file (a model in a models folder, or a linked import)",
    )
    rm.add_argument("--url", help="server address (default: the one the running server recorded)")
    rm.add_argument("--api-key", help="key for a server that requires one (default: $SWITCHYARD_API_KEY)")
    _models_dir_arg(rm)


def _models_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        dest="models_dirs",
        metavar="DIR",
        help="folder of models (repeatable; default $SWITCHYARD_HOME/models)",
    )


def _size(n: int) -> str:
    return fmt_bytes(n) if n > 0 else "-"


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def cmd_ls(args: argparse.Namespace, paths: Paths, settings: Settings) -> int:
    from app.library.listing import listing
    from app.library.opening import open_catalog

    library, catalog = open_catalog(settings, paths)
    try:
        models = listing(library, catalog)
    finally:
        library.close()
    dirs = [str(d) for d in catalog.dirs]
    remote_models = cli_remote.remote_models(paths)  # NAME/MODEL of each remote (docs/engines.md)
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
    if not models:
        print(
            f"no models in {', '.join(dirs)} or the Hugging Face cache {catalog.hf_cache} — put .gguf files "
            "there, `switchyard import PATH`, or `switchyard pull REPO`"
        )
    else:
        rows = [("ID", "FORMAT", "KIND", "SIZE", "SOURCE", "ORIGIN", "STATUS")]
        for m in models:
            o = m["origin"]
            origin = (f"{o['repo']}@{o['commit'][:7]}" if o["commit"] else o["repo"]) if o else "-"
            status = m["status"] if m["status"] == "ok" else f"{m['status']}: {m['problem']}"
            rows.append((m["id"], m["format"], m["kind"], _size(m["size"]), m["source"], origin, status))
        _table(rows)
    if remote_models:
        print()
        _table(
            [("REMOTE MODEL", "KIND", "URL")] + [(m["id"], m["kind"] or "-", m["url"]) for m in remote_models]
        )
    return 0


def cmd_import(args: argparse.Namespace, paths: Paths, settings: Settings) -> int:
    from app.library.importer import import_model
    from app.library.opening import open_catalog

    library, catalog = open_catalog(settings, paths)
    try:
        entry = import_model(
            args.path,
            catalog=catalog,
            library=library,
            imported_root=paths.imported,
            link=args.link,
            name=args.name,
        )
    finally:
        library.close()
    how = f"linked in place at {entry.path}" if args.link else f"copied to {entry.location}"
    print(f"imported {entry.id} ({entry.format}, {entry.kind}, {_size(entry.size)}): {how}")
    if not entry.ok:
        print(f"note: {entry.public()['problem']}", file=sys.stderr)
    return 0


def _running_server(args: argparse.Namespace, paths: Paths) -> str | None:
    if args.url:
        return str(args.url).rstrip("/")
    try:
        url = str(json.loads(paths.server_file.read_text())["url"])
    except (OSError, ValueError, KeyError):
        return None
    try:
        with urllib.request.urlopen(url + "/health", timeout=3):
            return url
    except (urllib.error.URLError, OSError):
        return None  # a stale server.json: the server is gone, work on the file directly


def _remote_rm(url: str, model: str, *, delete_files: bool, api_key: str | None) -> dict[str, Any]:
    from app import remote

    q = "?delete_files=true" if delete_files else ""
    req = urllib.request.Request(
        f"{url}/api/library/{urllib.parse.quote(model, safe='/:')}{q}", method="DELETE"
    )
    if (key := remote.api_key(api_key)) is not None:
        req.add_header("Authorization", f"Bearer {key.reveal()}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as exc:
        try:
            body = dict(json.loads(exc.read() or b"{}").get("error") or {})
        except (ValueError, AttributeError, TypeError):
            body = {}
        err = ModelInUseError if exc.code == 409 and body.get("code") == "model_loaded" else SwitchyardError
        raise err(body.get("message") or f"the server answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ServerNotRunningError(f"no Switchyard server answers at {url} ({exc})") from exc


def cmd_rm(args: argparse.Namespace, paths: Paths, settings: Settings) -> int:
    from app.library.remove import remove_model

    url = _running_server(args, paths)
    if url is not None:
        done = _remote_rm(url, args.model, delete_files=args.delete_files, api_key=args.api_key)
    else:
        from app.library.opening import open_catalog

        library, catalog = open_catalog(settings, paths)
        try:
            done = remove_model(
                args.model,
                catalog=catalog,
                library=library,
                imported_root=paths.imported,
                delete_files=args.delete_files,
            ).public()
        finally:
            library.close()
    if done["action"] == "unregistered":
        print(f"unregistered {done['id']}; your file is kept: {', '.join(done['kept'])}")
    else:
        print(f"removed {done['id']} ({done['source']}): deleted {len(done['deleted'])} file(s)")
        for p in done["deleted"]:
            print(f"  {p}")
    return 0
