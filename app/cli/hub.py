"""`switchyard search`, `switchyard show` and `switchyard hub login|logout|status`.

Hub calls use the settings (hf_endpoint, hf_proxy, offline) and the token store (app.hub.token); every
failure is a Switchyard error whose message says what to do, printed by app/__main__.py with exit code 2.
`search` and `show` go through the running server when one answers (as `pull` and `update` do), so every
command uses one hub: the server's; `--local` (or no server) asks from this process.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import textwrap
import urllib.parse
from typing import Any

from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, table
from app.core.paths import Paths
from app.core.units import fmt_bytes
from app.hub.refs import split_ref

SORT_CHOICES = ("downloads", "likes", "updated", "created", "trending")
FORMAT_CHOICES = ("gguf", "mlx", "safetensors", "diffusers", "whisper", "piper")


def register(sub: Subparsers) -> None:
    s = sub.add_parser("search", help="search models on Hugging Face")
    s.add_argument("query", nargs="?", default=None, help="words in the repository name (empty: all)")
    s.add_argument("--format", choices=FORMAT_CHOICES, help="only repositories in this format")
    s.add_argument("--sort", choices=SORT_CHOICES, default="downloads", help="order, best first")
    s.add_argument("--author", help="only this user or organisation")
    s.add_argument("--limit", type=int, default=20, help="results per page (1-100, default 20)")
    s.add_argument("--page", type=int, default=1, help="page number (the output names the next one)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    _server_args(s)

    sh = sub.add_parser(
        "show", help="a model on Hugging Face: card, files by quantization, and whether it fits"
    )
    sh.add_argument("repo", help="owner/name, or owner/name:QUANT (the same as --fit --quant QUANT)")
    sh.add_argument("--revision", help="branch, tag or commit (default main)")
    sh.add_argument(
        "--fit", action="store_true", help="read each quantization's header and check it fits here"
    )
    sh.add_argument("--quant", help="with --fit: only this quantization (e.g. Q4_K_M)")
    sh.add_argument("--card", action="store_true", help="print the model card")
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    _server_args(sh)

    hub = sub.add_parser("hub", help="Hugging Face token and connection: login, logout, status")
    hs = hub.add_subparsers(dest="hub_command", metavar="{login,logout,status}", required=True)
    li = hs.add_parser("login", help="store a Hugging Face token (in the system keyring)")
    li.add_argument("--token-stdin", action="store_true", help="read the token from standard input")
    li.add_argument(
        "--file",
        action="store_true",
        help="where no keyring exists, keep it in a 0600 file in SWITCHYARD_HOME",
    )
    li.add_argument(
        "--no-verify", action="store_true", help="store it without asking the hub whether it is valid"
    )
    hs.add_parser("logout", help="remove the stored token (keyring, file and this process)")
    st = hs.add_parser("status", help="endpoint, offline mode, proxy, and the token in use (never its value)")
    st.add_argument("--no-verify", action="store_true", help="do not ask the hub whether the token is valid")
    st.add_argument("--json", action="store_true", help="machine-readable output")


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server address (default: the running server, whose hub setting it uses)")
    p.add_argument("--local", action="store_true", help="ask the hub from this process, not the server")


def _hub(paths: Paths) -> Any:
    from app.core.settings import load_settings
    from app.hub.browse import Hub

    return Hub(paths, load_settings(paths.settings_file))


def _count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _server(args: argparse.Namespace, ctx: CliContext) -> ServerClient | None:
    """The running server, whose hub settings `pull` and `update` use too: search and show ask it, so a
    repository one finds is the one the other fetches. None (no server, or --local): this process."""
    return None if args.local else ctx.running(args.url, api_key=None)


def cmd_search(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.hub.api import SearchQuery

    query = SearchQuery(
        text=args.query,
        format=args.format,
        sort=args.sort,
        author=args.author,
        page=args.page,
        size=args.limit,
    )
    server = _server(args, ctx)
    if server is not None:
        params = {"q": args.query, "format": args.format, "sort": args.sort, "author": args.author}
        params |= {"page": args.page, "limit": args.limit}
        wanted = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        doc = server.get(f"/api/hub/search?{wanted}", timeout=120)
    else:
        doc = _hub(ctx.paths).client().search(query).public()
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if not doc["models"]:
        print("no models found" + (f" on page {args.page}" if args.page > 1 else ""))
        return 0
    rows = [("MODEL", "FORMATS", "DOWNLOADS", "LIKES", "UPDATED", "GATED")]
    for h in doc["models"]:
        rows.append(
            (
                h["id"],
                ",".join(h["formats"]) or "-",
                _count(h["downloads"]),
                _count(h["likes"]),
                (h["last_modified"] or "-")[:10],
                "yes" if h["gated"] else "",
            )
        )
    table(rows, pad_last=True)
    if doc["next_page"]:
        print(f"\nmore: add --page {doc['next_page']}")
    return 0


def _verdict_cells(v: dict[str, Any] | None) -> tuple[str, str, str, str]:
    from app.advice.hub_fit import VERDICT_WORDS, speed_words

    if v is None:
        return ("", "", "", "")
    if v.get("verdict") is None:
        return ("unknown", "-", "-", v.get("lane") or "-")
    return (
        VERDICT_WORDS.get(v["verdict"], v["verdict"]),
        str(v.get("max_ctx") or "-"),
        speed_words(v),
        v.get("lane") or "-",
    )


def cmd_show(args: argparse.Namespace, ctx: CliContext) -> int:
    repo, quant = split_ref(args.repo)
    if quant:
        args.fit, args.quant = True, quant
    server = _server(args, ctx)
    if server is not None:
        params = {"fit": "true" if args.fit else "false", "card": "true", "revision": args.revision}
        params["quant"] = args.quant
        wanted = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        doc = server.get(f"/api/hub/models/{repo}?{wanted}", timeout=300)
    else:
        hub = _hub(ctx.paths)
        client = hub.client()
        detail = client.detail(repo, revision=args.revision)
        if args.fit:
            from app.advice.hub_fit import fit_detail
            from app.advice.inputs import local_inputs

            inputs = local_inputs(hub.settings, ctx.paths)
            fit_detail(detail, reader=client.reader, inputs=inputs, only=args.quant)
        doc = detail.public()
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    _render_show(doc, card=args.card)
    return 0


def _render_show(doc: dict[str, Any], *, card: bool) -> None:
    gated = {False: "no", None: "no", "auto": "yes (automatic approval)", "manual": "yes (manual approval)"}
    print(f"{doc['id']} @ {doc['commit'][:12]}")
    print(f"  license: {doc['license'] or '-'}   gated: {gated.get(doc['gated'], str(doc['gated']))}")
    counts = f"downloads: {_count(doc['downloads'])}   likes: {_count(doc['likes'])}"
    print(f"  {counts}   updated: {(doc['last_modified'] or '-')[:19].replace('T', ' ')}")
    print(f"  formats: {', '.join(doc['formats']) or '-'}   size: {fmt_bytes(doc['size'])}")
    if doc["tags"]:
        print("  tags: " + textwrap.shorten(", ".join(doc["tags"]), 100))
    fit = doc.get("fit") or {}
    by_quant = fit.get("quantizations") or {}
    if doc["quantizations"]:
        print()
        head = ["QUANT", "SIZE", "FILES"]
        if fit:
            head += ["VERDICT", "MAX CTX", "SPEED", "LANE"]
        rows = [tuple(head)]
        for q in doc["quantizations"]:
            files = f"{len(q['files'])} part(s)" if q["parts"] > 1 else q["files"][0]["path"]
            if not q["complete"]:
                files += f" (only {len(q['files'])} of {q['parts']} on the hub)"
            row = [q["name"], fmt_bytes(q["size"]), files]
            if fit:
                row += list(_verdict_cells(by_quant.get(q["name"])))
            rows.append(tuple(row))
        table(rows, pad_last=True)
        for name, v in by_quant.items():
            if v.get("verdict") is None:
                print(f"  {name}: {v.get('problem') or v.get('summary')}")
            else:
                print(f"  {name}: {v['summary']}")
        if doc["projectors"]:
            print("  vision projectors: " + ", ".join(p["path"] for p in doc["projectors"]))
    weights = fit.get("safetensors")
    if weights:
        print(f"\nsafetensors weights: {weights['summary']}")
        if weights.get("note"):
            print(f"  ({weights['note']})")
        reasons = weights.get("reasons") or []
        print(f"  lane: {weights.get('lane') or 'none'}" + (f" ({reasons[0]})" if reasons else ""))
    if doc.get("fit_problem"):
        print(f"\nfit: {doc['fit_problem']}")
    if not fit and (doc["quantizations"] or "safetensors" in doc["formats"]):
        print(f"\n`switchyard show {doc['id']} --fit` checks whether each one fits this machine")
    if card:
        print()
        print(doc["card"] if doc["card"] is not None else f"(no card: {doc['card_problem']})")


def _read_token(args: argparse.Namespace) -> str:
    from app.core.errors import HubTokenError

    if args.token_stdin:
        return sys.stdin.readline()
    if not sys.stdin.isatty():
        raise HubTokenError("no terminal to ask for the token; pipe it in with --token-stdin")
    return getpass.getpass("Hugging Face token (https://huggingface.co/settings/tokens): ")


def cmd_hub(args: argparse.Namespace, paths: Paths) -> int:
    hub = _hub(paths)
    if args.hub_command == "status":
        return _status(hub, args)
    if args.hub_command == "logout":
        removed = hub.tokens.clear()
        print(f"removed the token from: {', '.join(removed)}" if removed else "no stored token to remove")
        if hub.tokens.find().source == "env":
            print("HF_TOKEN is set in the environment and is still used; unset it to log out fully")
        return 0
    return _login(hub, args)


def _login(hub: Any, args: argparse.Namespace) -> int:
    from app.hub.api import HubClient
    from app.hub.config import hub_config
    from app.hub.token import check_token

    token = check_token(_read_token(args))
    config = hub_config(hub.settings, token=token)
    user = None
    if not args.no_verify and not config.offline:
        who = HubClient(config, hub.reader(config)).whoami() or {}
        user = who.get("name")
    elif config.offline:
        print("offline mode is on: the token was not checked with the hub", file=sys.stderr)
    stored = hub.tokens.set(token, to_file=args.file)
    who_text = f" for {user}" if user else ""
    if stored.persistent:
        print(f"logged in{who_text}: the token is {stored.note}")
        if hub.tokens.find().source == "env":
            print("note: HF_TOKEN is set in the environment and takes precedence over the stored token")
        return 0
    print(f"token accepted{who_text}, but not kept: {stored.note}", file=sys.stderr)
    return 1


def _status(hub: Any, args: argparse.Namespace) -> int:
    doc = hub.status(verify=not args.no_verify)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    token = doc["token"]
    where = {
        "env": "HF_TOKEN in the environment",
        "keyring": "the system keyring",
        "session": "this process only",
        "file": doc["token_file"],
    }
    print(f"endpoint: {doc['endpoint']}")
    print(f"offline:  {'yes' if doc['offline'] else 'no'}")
    print(f"proxy:    {doc['proxy'] or '-'}")
    print(f"cache:    {doc['cache_dir']}")
    if not token["set"]:
        print("token:    none (public repositories only; `switchyard hub login` to add one)")
    else:
        check = {True: f"valid, user {doc['user']}", False: "REJECTED by the hub", None: "not checked"}
        print(f"token:    set, from {where[token['source']]} ({check[doc['verified']]})")
    for p in token["problems"]:
        print(f"  note: {p}")
    if doc["problem"]:
        print(f"  {doc['problem']}")
    return 1 if doc["verified"] is False else 0


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.command == "search":
        return cmd_search(args, ctx)
    if args.command == "show":
        return cmd_show(args, ctx)
    return cmd_hub(args, ctx.paths)
