"""`switchyard remote add|ls|rm|check`: OpenAI-compatible endpoints elsewhere, served as `NAME/MODEL`.

Every command goes through the running server's admin API when one answers (app/cli/client.py finds
it, or --url), so a key given to `add` is kept by the server: in the keyring, or where there is none (headless
Linux), in the server's memory. With no server running, the commands work on remotes.json and the keyring
directly; a key then needs a keyring (or SWITCHYARD_REMOTE_KEY_<NAME> in the server's environment).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import BadRequestError, SwitchyardError
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.secrets import Secret

if TYPE_CHECKING:  # the lanes (and aiohttp) are imported when a command runs, not for every CLI start
    from app.lanes.remote.store import RemoteStore


def register(sub: Subparsers) -> None:
    rem = sub.add_parser(
        "remote", help="serve models of an OpenAI-compatible endpoint elsewhere (NAME/MODEL)"
    )
    rsub = rem.add_subparsers(dest="remote_command", required=True)
    add = rsub.add_parser("add", help="register a remote and check it")
    add.add_argument("name", help="its name; its models are served as NAME/MODEL")
    add.add_argument("url", help="its OpenAI API root, e.g. http://gpu-box:8000/v1")
    add.add_argument(
        "--api-key-stdin",
        action="store_true",
        help="read the remote's API key from stdin (kept in the keyring)",
    )
    add.add_argument(
        "--model", action="append", default=[], dest="models", help="serve only this model (repeat)"
    )
    rsub.add_parser("ls", help="list the remotes and their state")
    rm = rsub.add_parser("rm", help="remove a remote and its key")
    rm.add_argument("name", help="the remote's name, as `switchyard remote ls` shows it")
    chk = rsub.add_parser("check", help="check a remote now (exit 1 unless it is ready)")
    chk.add_argument("name", help="the remote's name, as `switchyard remote ls` shows it")
    for p in (add, rm, chk, rsub.choices["ls"]):
        p.add_argument("--url", dest="server_url", help="server address (default: the running server)")
        api_key_arg(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")


# ---- without a server: the files, the keyring and a check from here --------------------------------------
async def _check_here(store: RemoteStore, name: str) -> dict[str, Any]:
    import aiohttp

    from app.lanes.remote.lane import Remote

    remote = Remote(store.get(name), bus=EventBus(), key=store.key(name))
    async with aiohttp.ClientSession() as http:
        if await remote.check(http, key=store.key(name)):
            store.record_seen(name, remote.seen)
    return remote.public()


def check_here(store: RemoteStore, name: str) -> dict[str, Any]:
    return asyncio.run(_check_here(store, name))


def read_key(args: argparse.Namespace) -> Secret | None:
    if not args.api_key_stdin:
        return None
    text = getpass.getpass("API key of the remote: ") if sys.stdin.isatty() else sys.stdin.readline()
    key = text.strip()
    if not key or not key.isprintable():
        raise BadRequestError("the API key read from stdin is empty or has control characters")
    return Secret(key)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.lanes.remote.registry import notes_for
    from app.lanes.remote.store import RemoteSpec, RemoteStore, check_name, normalize_url

    server = ctx.running(args.server_url, api_key=args.api_key)
    store = RemoteStore.at(ctx.paths.home)
    cmd = args.remote_command
    if cmd == "add":
        check_name(args.name)
        base = normalize_url(args.url)  # refused here, before a key is read
        secret = read_key(args)
        if server is not None:
            body: dict[str, Any] = {"name": args.name, "url": base, "models": args.models}
            if secret is not None:
                body["api_key"] = secret.reveal()
            doc = server.call("POST", "/api/remotes", body=body)
        else:
            stored, problem = store.add(RemoteSpec(args.name, base, tuple(args.models)), secret)
            notes = notes_for(stored, key_problem=problem)
            if stored.key_kept == "session":
                notes[0] = (
                    f"{problem} and no server is running, so the key was not kept anywhere: start "
                    f"`switchyard serve` and add the remote again, or set it in the server's environment"
                )
            doc = {**check_here(store, args.name), "notes": notes}
        return _print_one(doc, args, verb="added")
    if cmd == "ls":
        remotes = server.get("/api/remotes")["remotes"] if server else offline_list(store)
        if args.json:
            print(json.dumps({"remotes": remotes}, indent=2))
        else:
            print_table(remotes)
        return 0
    if cmd == "rm":
        if server is not None:
            server.call("DELETE", f"/api/remotes/{urllib.parse.quote(args.name, safe='')}")
        else:
            store.remove(args.name)
        print(
            json.dumps({"name": args.name, "removed": True}) if args.json else f"removed remote {args.name}"
        )
        return 0
    if server is not None:
        doc = server.call("POST", f"/api/remotes/{urllib.parse.quote(args.name, safe='')}/check")
    else:
        doc = check_here(store, args.name)
    _print_one(doc, args, verb="checked")
    return 0 if doc["state"] == "ready" else 1


def offline_list(store: RemoteStore) -> list[dict[str, Any]]:
    """The remotes as remotes.json has them (state unknown: nothing is checked)."""
    from app.lanes.remote.lane import Remote

    out = []
    for spec in store.specs():
        remote = Remote(spec, bus=EventBus(), key=store.key(spec.name))
        doc = remote.public()
        doc["state"] = "not checked (no server running; `switchyard remote check NAME`)"
        out.append(doc)
    return out


def _print_one(doc: dict[str, Any], args: argparse.Namespace, *, verb: str) -> int:
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    models = ", ".join(m["id"] for m in doc["models"]) or "none listed"
    line = f"{verb} remote {doc['name']} ({doc['url']}): {doc['state']}; models: {models}"
    print(line)
    if doc.get("error"):
        print(f"  {doc['error']}")
    for note in doc.get("notes", []):
        print(f"note: {note}", file=sys.stderr)
    return 0


def print_table(remotes: list[dict[str, Any]]) -> None:
    if not remotes:
        print("no remotes; add one with `switchyard remote add NAME http://host:port/v1 [--api-key-stdin]`")
        return
    rows = [("NAME", "URL", "STATE", "KEY", "MODELS")]
    for r in remotes:
        k = r["key"]
        key = k["source"] or ("lost (session only)" if k.get("kept") == "session" else "none")
        models = ", ".join(m["id"] for m in r["models"]) or "-"
        state = r["state"] + (f" ({r['in_flight']} in flight)" if r.get("in_flight") else "")
        rows.append((r["name"], r["url"], state, key, models))
    table(rows)
    for r in remotes:
        if r.get("error"):
            print(f"  {r['name']}: {r['error']}")


def remote_models(paths: Paths) -> list[dict[str, Any]]:
    """Each remote's models as `switchyard ls` lists them (from remotes.json: no network)."""
    from app.lanes.remote.store import RemoteStore

    try:
        specs = RemoteStore.at(paths.home).specs()
    except SwitchyardError:
        return []
    out = []
    for spec in specs:
        kinds = {m.id: m.kind for m in spec.seen}
        for mid in spec.models or tuple(kinds):
            out.append(
                {"id": f"{spec.name}/{mid}", "remote": spec.name, "url": spec.url, "kind": kinds.get(mid)}
            )
    return out


def doctor_rows(paths: Paths, *, cacert: Path | None = None) -> list[dict[str, Any]]:
    """Each remote's state for `switchyard doctor`: from the running server, else checked from here."""
    from app.lanes.remote.store import RemoteStore

    server = CliContext(paths, cacert=cacert).running(None, api_key=None)
    if server is not None:
        try:
            return list(server.get("/api/remotes")["remotes"])
        except SwitchyardError:
            pass  # an older server, or one that wants a key: check from here instead
    store = RemoteStore.at(paths.home)
    try:
        return [check_here(store, spec.name) for spec in store.specs()]
    except SwitchyardError:
        return []
