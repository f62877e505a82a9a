"""`switchyard peers invite|add|ls|nearby|check|rm|trust`: pair machines, serve each other's models as
PEER/MODEL.

Every command but `trust` goes through this machine's running server (started with `serve --tls`): the
server holds the TLS site peers call, the pairing codes and the keys. `trust` writes this machine's
peers.json, which the server reads afresh. See docs/peers.md.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import ServerNotRunningError


def register(sub: Subparsers) -> None:
    p = sub.add_parser("peers", help="pair with other machines and serve their models as PEER/MODEL")
    psub = p.add_subparsers(dest="peers_command", required=True)
    psub.add_parser("invite", help="show a one-time pairing code, this server's address and fingerprint")
    add = psub.add_parser("add", help="pair with the machine at HOST:PORT that showed a code")
    add.add_argument("address", help="HOST:PORT as `switchyard peers invite` showed it there")
    add.add_argument("--code", required=True, help="the one-time code shown there (XXXXX-XXXXX)")
    add.add_argument("--name", help="the name to serve its models under (default: its machine name)")
    add.add_argument(
        "--fingerprint", help="the certificate fingerprint shown there: pairing fails if another answers"
    )
    psub.add_parser("ls", help="list the peers, their state and models")
    near = psub.add_parser("nearby", help="list machines nearby that announce Switchyard on mDNS (a hint)")
    near.add_argument(
        "--seconds", type=float, default=3.0, help="how long to listen for announcements (1-10, default 3)"
    )
    chk = psub.add_parser("check", help="check a peer now: health, hardware, models (exit 1 unless ready)")
    chk.add_argument("name", help="the peer's name, as `switchyard peers ls` shows it")
    rm = psub.add_parser("rm", help="unpair: its models go, its key and certificate stop working")
    rm.add_argument("name", help="the peer's name, as `switchyard peers ls` shows it")
    for q in psub.choices.values():
        q.add_argument("--url", dest="server_url", help="server address (default: the running server)")
        api_key_arg(q)
        q.add_argument("--json", action="store_true", help="machine-readable output")
    # peers.json itself (read afresh by a running server), so no --url: it is this machine's own say
    trust = psub.add_parser(
        "trust", help="mark the network to a peer as yours: multi-node vLLM and SGLang may then use it"
    )
    trust.add_argument("name", help="the peer's name, as `switchyard peers ls` shows it")
    which = trust.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--network",
        dest="trusted_network",
        action="store_true",
        help="trusted: only you control it (their traffic between machines is not encrypted)",
    )
    which.add_argument("--no-network", dest="trusted_network", action="store_false", help="no longer trusted")
    trust.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.peers_command == "trust":
        return _trust(args, ctx)
    server = ctx.running(args.server_url, api_key=args.api_key)
    if server is None:
        raise ServerNotRunningError(
            "peers work through this machine's server: start it with `switchyard serve --tls` "
            "(add --host 0.0.0.0 to be reachable from other machines), then run this again"
        )
    cmd = args.peers_command
    if cmd == "invite":
        doc = server.call("POST", "/api/peers/invite")
        if not args.json:
            print(f"pairing code {doc['code']} (one use, valid {doc['expires_in_s'] / 60:.0f} minutes)")
            print(f"certificate fingerprint {doc['fingerprint']}")
            for address in doc["addresses"]:
                print(f"on the other machine: switchyard peers add {address} --code {doc['code']}")
    elif cmd == "add":
        body: dict[str, Any] = {"address": args.address, "code": args.code}
        if args.name:
            body["name"] = args.name
        if args.fingerprint:
            body["fingerprint"] = args.fingerprint
        doc = server.call("POST", "/api/peers", body=body, timeout=60)
        if not args.json:
            print(f"paired with {doc['name']} ({doc['url']}): {doc['state']}; models: {_models(doc)}")
            print(f"its certificate fingerprint {doc['fingerprint']} is pinned")
    elif cmd == "ls":
        doc = server.get("/api/peers")
        if not args.json:
            print_table(doc)
    elif cmd == "nearby":
        doc = server.get(f"/api/peers/nearby?seconds={args.seconds:g}", timeout=args.seconds + 30)
        if not args.json:
            print_nearby(doc)
    elif cmd == "check":
        doc = server.call("POST", f"/api/peers/{_q(args.name)}/check", timeout=60)
        if not args.json:
            print(f"{doc['name']} ({doc['url']}): {doc['state']}; models: {_models(doc)}")
            if doc.get("error"):
                print(f"  {doc['error']}")
            if doc.get("info", {}).get("hardware"):
                print(f"  hardware: {_hardware(doc['info']['hardware'])}")
    else:
        doc = server.call("DELETE", f"/api/peers/{_q(args.name)}")
        if not args.json:
            print(f"removed peer {args.name}")
    if args.json:
        print(json.dumps(doc, indent=2))
    return 1 if cmd == "check" and doc["state"] != "ready" else 0


def _trust(args: argparse.Namespace, ctx: CliContext) -> int:
    from app.lanes.peers.store import PeerStore

    spec = PeerStore(ctx.paths.home / "peers").set_trusted_network(args.name, args.trusted_network)
    if args.json:
        print(json.dumps({"name": spec.name, "trusted_network": spec.trusted_network}, indent=2))
    elif spec.trusted_network:
        print(
            f"the network to {spec.name} is marked trusted: multi-node vLLM and SGLang may run across it "
            "(what they send between machines is not encrypted; undo with --no-network)"
        )
    else:
        print(f"the network to {spec.name} is no longer trusted: multi-node vLLM and SGLang will not use it")
    return 0


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _models(doc: dict[str, Any]) -> str:
    return ", ".join(m["id"] for m in doc.get("models", [])) or "none listed"


def _hardware(hw: dict[str, Any]) -> str:
    mem = hw.get("memory") or {}
    total = mem.get("total")
    parts = [f"{total / 2**30:.1f} GiB RAM" if isinstance(total, int) else "RAM unknown"]
    gpus = hw.get("gpus") or []
    parts += [f"{g.get('name', 'GPU')}" for g in gpus]
    return ", ".join(parts)


def print_table(doc: dict[str, Any]) -> None:
    pairing = doc["pairing"]
    if pairing.get("locked_for_s"):
        print(f"pairing is locked for {pairing['locked_for_s']:.0f} s (too many wrong codes)")
    if not doc["peers"]:
        print(
            "no peers; on the other machine run `switchyard peers invite`, then `switchyard peers add` here"
        )
        return
    rows = [("NAME", "URL", "STATE", "MODELS")]
    for p in doc["peers"]:
        rows.append((p["name"], p["url"], p["state"], _models(p)))
    table(rows)
    for p in doc["peers"]:
        if p.get("error"):
            print(f"  {p['name']}: {p['error']}")


def print_nearby(doc: dict[str, Any]) -> None:
    """Each machine found with its pairing line; the lines are hints: the code comes from that machine."""
    machines = doc["machines"]
    if not machines:
        print(
            f"no machine announced Switchyard on mDNS within {doc['seconds']:g} s; on the other machine run "
            "`switchyard peers invite` and type the address it shows (multicast may not cross this network)"
        )
        return
    rows = [("MACHINE", "ADDRESS", "PAIRED AS")]
    for m in machines:
        rows.append((m["machine"], m["address"], m["paired"] or "-"))
    table(rows)
    unpaired = [m for m in machines if not m["paired"]]
    if unpaired:
        print("to pair, run `switchyard peers invite` there and type its code in place of CODE here:")
        for m in unpaired:
            print(f"  {m['add_command']}")
        print("(announcements are not trusted: check that `peers invite` there shows the same fingerprint;")
        print(" pairing fails unless the machine at that address has it, and needs the code shown there)")
