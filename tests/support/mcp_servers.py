"""Real MCP servers written with the official SDK (`MCPServer`, FastMCP's successor in mcp 2.x), for the
Responses API's mcp tool tests. Run as `python -m tests.support.mcp_servers MODE [--marker FILE] [--http
PORT]` from
the checkout (tests/platform would shadow the standard library's `platform` were it run as a script).

`good` offers `lookup(city)`, which answers a fixed sentence and appends the city to the `--marker` file
(so a test can tell whether a call ran at all). The hostile modes offer the same tool but misbehave inside
the call: `hang` never answers, `huge` answers 8 MB, `malformed` writes a line that is not JSON-RPC to the
protocol pipe (then hangs), `crash` exits mid-call.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Literal

from mcp.server.mcpserver import MCPServer

ANSWER = "lookup says: Paris is sunny, 21 C"
PROTOCOL_OUT = os.dup(1)  # taken before the SDK claims stdout


def build(mode: str) -> MCPServer:
    app = MCPServer(f"switchyard-test-{mode}")

    @app.tool()
    def lookup(city: Literal["Paris"]) -> str:
        """Look up the weather of a city."""
        marker = os.environ.get("MCP_MARKER")
        if marker:
            with open(marker, "a", encoding="utf-8") as f:
                f.write(city + "\n")
        if mode == "hang":
            time.sleep(3600)
        elif mode == "huge":
            return "x" * (8 * 1024 * 1024)
        elif mode == "malformed":
            # the pipe the client reads: the SDK moves fd 1 away from it while serving, to protect it
            os.write(PROTOCOL_OUT, b"this is not JSON-RPC {\n")
            time.sleep(3600)
        elif mode == "crash":
            os._exit(3)
        return ANSWER

    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("good", "hang", "huge", "malformed", "crash"))
    ap.add_argument("--marker", help="a file each call of lookup appends its city to")
    ap.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port")
    opts = ap.parse_args()
    if opts.marker:
        os.environ["MCP_MARKER"] = opts.marker
    server = build(opts.mode)
    if opts.http:
        server.run(transport="streamable-http", port=opts.http)
    else:
        server.run()
