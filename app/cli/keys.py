"""`switchyard keys create|ls|revoke`: API keys for clients, one per client name.

`create` prints the secret once on stdout (so `KEY=$(switchyard keys create editor)` works) and what
happened to it on stderr: stored in the system keyring, or, where there is none, kept nowhere.
"""

from __future__ import annotations

import argparse
import sys

from app.cli.context import CliContext
from app.cli.options import Subparsers, show_list


def register(sub: Subparsers) -> None:
    keys = sub.add_parser("keys", help="API keys for clients: create, ls, revoke")
    ks = keys.add_subparsers(dest="keys_command", metavar="{create,ls,revoke}", required=True)
    c = ks.add_parser("create", help="make a key for a client; its secret is printed once")
    c.add_argument("name", help="the client's name, e.g. editor or laptop (letters, digits, . _ -)")
    # `ls` as in every other group; `list`, its first name, still works
    ls = ks.add_parser(
        "ls", aliases=["list"], help="names, creation times and last 4 characters (never the secret)"
    )
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    r = ks.add_parser("revoke", help="delete a key; clients using it get 401 from then on")
    r.add_argument("name", help="the key's name, as `switchyard keys ls` shows it")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.core.secrets import KeyStore

    store = KeyStore.at(ctx.paths)
    if args.keys_command == "create":
        # create() returns only once the key is durably in keys.json (under its lock, so concurrent
        # creates all land): a printed key is never one that was lost
        created = store.create(args.name)
        print(f"created API key {created.info.name!r}; it is shown only this once:", file=sys.stderr)
        print(created.secret.reveal(), flush=True)
        print(created.note(), file=sys.stderr)
        return 0
    if args.keys_command == "revoke":
        info = store.revoke(args.name)
        print(f"revoked API key {info.name!r} (…{info.last4}); clients using it now get 401")
        return 0
    entries = store.entries()
    show_list(
        {"file": str(store.path), "keys": [k.public() for k in entries]},
        as_json=args.json,
        empty="no API keys; create one with `switchyard keys create NAME`",
        rows=lambda: [
            ("NAME", "CREATED", "KEY", "KEYRING"),
            *((k.name, k.created, f"…{k.last4}", "yes" if k.in_keyring else "no") for k in entries),
        ],
    )
    return 0
