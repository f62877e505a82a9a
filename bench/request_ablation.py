"""What serve's CPU per request is made of, by taking the request's own steps away a layer at a time.

`gateway_request_cost.py` measures serve's CPU per one-token streamed chat; this runs it against copies of
the checkout with layers of the request path cut out, to see how much of that CPU is Switchyard's own
steps and how much is what any Python relay on aiohttp pays. It makes a `git worktree` of HEAD in a
temporary folder, edits it there (never the checkout), and per round, in an order that rotates, starts
one serve of that tree per level, each with `ABL=<level>` in its environment:

- **0**: the tree as it is;
- **1**: the request's features skipped in the OpenAI pass-through (after the model is resolved: the
  tool-choice and thinking rewrites, the image check, the safety gate, the prompt-length check, the session
  bank's slot, the output clamp, the logprobs and draft notes, the tool-call recovery): the lane's hold
  and the relay alone;
- **2**: also the outer middleware's work (the /metrics count, the access log line, the `request.done`
  event) and the front door's (Host and Origin, API keys);
- **3**: also the limits and the peers' middleware, the body's parse and checks, the model's resolve and
  the lane's hold: aiohttp's routing, the body's read and the protocol-level relay to the engine, nothing
  else of ours.

A cut step cannot be switched off in the product: this only says what each layer costs. The figure is the
median of `gateway_request_cost.py --sides openai,health,bare`'s per-round medians, serve's CPU per
request, beside the bare relay's per request in the same runs (which parses nothing: the yardstick).
The worktree is of HEAD: commit a change to the benchmarks before measuring with it.

    .venv/bin/python bench/request_ablation.py               # 3 rounds, 2 inner rounds of 40 requests
    .venv/bin/python bench/request_ablation.py --rounds 5 --keep /tmp/abl   # keep the edited tree
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWITCH = 'import os as _os\n_ABL = int(_os.environ.get("ABL", "0"))\n'
LEVELS = (0, 1, 2, 3)

# (file, anchor, replacement): each anchor must appear once in HEAD's file, else the tree moved on and
# this script needs its edits brought up to date (it says which)
EDITS: list[tuple[str, str, str]] = [
    (
        "app/server/gateway/proxy.py",
        "    request[MODEL] = to.model\n",
        "    request[MODEL] = to.model\n"
        "    if _ABL >= 1:\n"
        "        async with gw.hold(to) as target:\n"
        "            _T[:] = [target]\n"
        "            return await _relay_local(request, gw, target, path, raw, None)\n",
    ),
    (
        "app/server/gateway/proxy.py",
        "    raw = await request.read()\n    body = parse_body(raw)\n",
        "    raw = await request.read()\n"
        "    if _ABL >= 3 and _T:\n"
        "        return await _relay_local(request, request.app[GATEWAY], _T[0], path, raw, None)\n"
        "    body = parse_body(raw)\n",
    ),
    ("app/server/gateway/proxy.py", "\nasync def forward(", "\n_T: list = []\n\n\nasync def forward("),
    (
        "app/server/middleware.py",
        "        t0 = time.perf_counter()\n        stats.in_flight += 1\n",
        "        if _ABL >= 2:\n"
        "            return await handler(request)\n"
        "        t0 = time.perf_counter()\n"
        "        stats.in_flight += 1\n",
    ),
    (
        "app/server/auth.py",
        "    guard = guard_of(request)\n    refused = host_refusal(",
        "    if _ABL >= 2:\n"
        "        return await handler(request)\n"
        "    guard = guard_of(request)\n"
        "    refused = host_refusal(",
    ),
    (
        "app/server/limits.py",
        "    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:\n",
        "    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:\n"
        "        if _ABL >= 3:\n"
        "            return await handler(request)\n",
    ),
    (
        "app/server/admin/peers.py",
        "    client = request.get(CLIENT)\n    peer_route =",
        "    if _ABL >= 3:\n"
        "        return await handler(request)\n"
        "    client = request.get(CLIENT)\n"
        "    peer_route =",
    ),
]
LINE = re.compile(r"^(openai|health|bare)\s+serve CPU per request: median\s+(\d+) us", re.M)


def make_tree(where: Path) -> None:
    """A worktree of HEAD at `where`, with the level switch and the cuts."""
    subprocess.run(["git", "worktree", "add", "-f", "--detach", str(where), "HEAD"], cwd=REPO, check=True)
    touched: set[str] = set()
    for name, anchor, replacement in EDITS:
        path = where / name
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"{name}: the anchor {anchor.strip()[:60]!r} is not there once; update EDITS")
        path.write_text(text.replace(anchor, replacement))
        touched.add(name)
    for name in touched:  # the switch after the module's imports (after `from __future__`)
        path = where / name
        text = path.read_text()
        head, sep, rest = text.partition("\nfrom __future__ import annotations\n")
        path.write_text(head + sep + SWITCH + rest if sep else SWITCH + text)


def one(tree: Path, level: int, inner_rounds: int, requests: int) -> dict[str, int]:
    """CPU per request at `level`, µs: serve's for a one-token stream ('openai') and a GET /health, and
    the bare relay's for the same stream ('bare', which no level changes: the run's yardstick)."""
    argv = [
        sys.executable,
        str(tree / "bench" / "gateway_request_cost.py"),
        "--sides",
        "openai,health,bare",
        "--rounds",
        str(inner_rounds),
        "--requests",
        str(requests),
    ]
    out = subprocess.run(
        argv, cwd=tree, env=dict(os.environ, ABL=str(level)), capture_output=True, text=True, check=False
    )
    found = {m.group(1): int(m.group(2)) for m in LINE.finditer(out.stdout)}
    if out.returncode != 0 or set(found) != {"openai", "health", "bare"}:
        raise SystemExit(f"level {level} failed:\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}")
    return found


def load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner-rounds", type=int, default=2, help="gateway_request_cost.py's rounds per run")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--keep", type=Path, help="make the edited tree here and keep it")
    args = ap.parse_args(argv)
    tree = args.keep or Path(tempfile.mkdtemp(prefix="sy-ablation-")) / "tree"
    make_tree(tree)
    got: dict[int, list[dict[str, int]]] = {lv: [] for lv in LEVELS}
    try:
        for r in range(args.rounds):
            order = LEVELS[r % len(LEVELS) :] + LEVELS[: r % len(LEVELS)]
            cells = []
            for level in order:
                before = load()
                res = one(tree, level, args.inner_rounds, args.requests)
                got[level].append(res)
                cells.append(
                    f"L{level} {res['openai']:5d} us (health {res['health']:3d}, bare {res['bare']:3d}, "
                    f"load {before:.1f})"
                )
            print(f"round {r + 1}: " + " | ".join(cells), flush=True)
    finally:
        if args.keep is None:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
            shutil.rmtree(tree.parent, ignore_errors=True)
    base = statistics.median(x["openai"] for x in got[0])
    for level in LEVELS:
        med = statistics.median(x["openai"] for x in got[level])
        health = statistics.median(x["health"] for x in got[level])
        bare = statistics.median(x["bare"] for x in got[level])
        print(
            f"level {level}: serve CPU per one-token stream, median {med:5.0f} us "
            f"({med - base:+5.0f} us against level 0, {med / bare:4.2f}x the bare relay's {bare:.0f} us "
            f"in the same runs); GET /health {health:.0f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
