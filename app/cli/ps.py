"""`switchyard ps`: the lanes (and remote lanes) of the running server."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli import remote
from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, table
from app.core.errors import ServerNotRunningError, SwitchyardError
from app.core.units import fmt_bytes


def register(sub: Subparsers) -> None:
    ps = sub.add_parser("ps", help="show the lanes of the running server")
    ps.add_argument("--url", help="server address (default: the one the running server recorded)")
    ps.add_argument("--json", action="store_true", help="machine-readable output")
    api_key_arg(ps)


def _footprints(lane: dict[str, Any]) -> tuple[str, str]:
    """(measured, predicted): the settle footprint of the model's last load and the plan's prediction;
    residency plans with the measured one once there is one. MLX lanes predict nothing (runtime-managed)."""
    out = []
    for source in ("measured", "predicted"):
        fp = lane.get(f"footprint_{source}")
        if f"footprint_{source}" not in lane:  # an older server: only the figure in use, with its source
            used = lane.get("footprint")
            fp = used if isinstance(used, dict) and used.get("source") == source else None
        if isinstance(fp, dict) and fp.get("total") is not None:
            out.append(fmt_bytes(int(fp["total"])))
        elif source == "predicted" and lane.get("capacity") == "runtime-managed":
            out.append("none (runtime-managed)")
        else:
            out.append("-")
    return out[0], out[1]


def _bank_line(server: ServerClient) -> None:
    try:  # an older server, or one with banking off, has nothing to say here
        bank = server.get("/api/bank", timeout=5)
    except SwitchyardError:
        return
    if bank.get("enabled", True) and bank.get("checkpoints"):
        used = fmt_bytes(bank["bytes"])
        print(
            f"session bank: {len(bank['checkpoints'])} saved conversation(s), {used} of "
            f"{fmt_bytes(bank['budget_bytes'])} (`switchyard bank ls`)"
        )


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    server = ctx.server(args.url, api_key=args.api_key)
    url = server.url
    try:
        lanes = server.get("/api/lanes", timeout=5)["lanes"]
    except ServerNotRunningError as exc:
        if not exc.message.startswith("no Switchyard server answers"):
            raise  # it answered, with a certificate not trusted here: starting one would not help
        raise ServerNotRunningError(f"{exc.message}; start one with `switchyard serve`") from exc
    try:  # remote lanes (app/cli/remote.py); an older server has no /api/remotes
        remotes = server.get("/api/remotes", timeout=5)["remotes"]
    except SwitchyardError:
        remotes = []
    if args.json:
        print(json.dumps({"url": url, "lanes": lanes, "remotes": remotes}, indent=2))
        return 0
    if not lanes:
        print(f"server at {url}: no lanes yet (a lane starts when a request names its model)")
    else:
        rows = [("MODEL", "STATE", "PID", "PORT", "IN-FLIGHT", "MEASURED", "PREDICTED", "ERROR")]
        for ln in lanes:
            rows.append(
                (
                    ln["model"],
                    ln["state"],
                    str(ln["pid"] or "-"),
                    str(ln["port"] or "-"),
                    str(ln["in_flight"]),
                    *_footprints(ln),
                    (ln["error"] or "")[:120],
                )
            )
        table(rows)
    _bank_line(server)
    if remotes:
        print("remotes:")
        remote.print_table(remotes)
    return 0
