"""The gateway's CPU per request, apart from its CPU per event: streamed answers of one token, one after
another, so the fixed work of a request (middlewares, parse, resolve, the lane's hold, the engine
connection, the response head, the Anthropic prompt count, the speed record) is nearly all serve does.

One real `switchyard serve` with the generated medium model; per round, in an order that rotates, waves
of `--requests` requests sent one after another: **direct** (streamed chats of `--tokens` letters, a
grammar forcing them, to the engine's own port: serve only idles, which is its background rate),
**openai** (the same through `/v1/chat/completions`, the byte relay), **anthropic** (the same through
`/v1/messages`, the translated relay), two layers under a request for scale: **health** (`GET
/health`: the HTTP server and the middlewares) and **refused** (a chat without messages, a 400: those
plus the body's read, parse and checks and an error answer), and **bare** (the same streamed chat through
gateway_floor.py's bare uvloop relay in front of the engine, in its own process: what a relay that parses
nothing costs per request; the figure is that process's CPU, and it pays an accept per request, since it
ends a client connection with the engine's). The figure per round is serve's CPU over the
wave minus its background rate over the same wall time, per request, and the same for its event loop
thread alone (the rest is worker threads: the speed store's SQLite, the bank's hashing); the summary is
the median and the spread over the rounds. It is CPU time, not wall time, so a loaded machine moves it
far less than a latency; compare before/after in the same window anyway.

    .venv/bin/python bench/gateway_request_cost.py                 # 5 rounds of 40 requests per side
    .venv/bin/python bench/gateway_request_cost.py --tokens 64     # per event = (this - the above) / 63
    .venv/bin/python bench/gateway_request_cost.py --profile /tmp/stacks.txt    # py-spy, collapsed
    .venv/bin/python bench/gateway_request_cost.py --cprofile /tmp/req.prof     # cProfile, loop CPU
    .venv/bin/python bench/gateway_request_cost.py --sides openai --cprofile /tmp/oa.prof  # one side alone

`--cprofile` runs serve under cProfile timed by its loop thread's CPU (not the wall, which on a loaded
machine charges every preemption to whatever ran), switched on after the warm-up round and off at the
end (SIGUSR1, SIGUSR2); read it with pstats, divided by the requests of the measured rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import gateway_floor as gf
import gateway_overhead as go
import gw_peers
import gw_surfaces as sf

PROMPT = "Say one letter."
# cProfile timed by the event loop thread's own CPU (on a loaded machine the wall charges every
# preemption to whatever function ran), on only between SIGUSR1 and SIGUSR2: the measured rounds alone,
# without the imports, the start and the model's load
CPROFILE_CPU_CODE = (
    "import cProfile, signal, sys, time\n"
    "out = sys.argv[1]\n"
    "sys.argv = ['switchyard'] + sys.argv[2:]\n"
    "prof = cProfile.Profile(time.thread_time)\n"
    "signal.signal(signal.SIGUSR1, lambda *_: prof.enable())\n"
    "signal.signal(signal.SIGUSR2, lambda *_: (prof.disable(), prof.dump_stats(out)))\n"
    "from app.__main__ import main\n"
    "main(sys.argv[1:])\n"
)


def routes(model: str, *, engine: str, gateway: str, tokens: int) -> list[go.Route]:
    direct = json.dumps(sf.openai_body(model, PROMPT, tokens, grammar=True)).encode()
    anthropic = sf.surface_body("anthropic", model, PROMPT, tokens, grammar=True)
    return [
        go.Route("direct", engine + sf.ROUTES["openai"], direct, "openai", "serve"),
        go.Route("openai", gateway + sf.ROUTES["openai"], direct, "openai", "serve"),
        go.Route("anthropic", gateway + sf.ROUTES["anthropic"], anthropic, "anthropic", "serve"),
    ]


def loop_cpu_s(pid: int) -> float:
    """CPU time of serve's main thread alone (its event loop), from schedstat (ns)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


@dataclass(frozen=True)
class Wave:
    cpu_s: float  # serve, all threads
    loop_s: float  # serve's event loop thread
    wall_s: float


# the layers under a request, answered without an engine: the HTTP server and the middlewares (GET /health);
# those plus the body's read, its parse and checks and an error answer (a chat without messages: 400)
LAYERS = {
    "health": ("GET", "/health", b"", 200),
    "refused": ("POST", "/v1/chat/completions", b'{"model": "medium", "stream": true}', 400),
}


async def plain(http: aiohttp.ClientSession, url: str, name: str) -> None:
    method, path, body, status = LAYERS[name]
    headers = {"Content-Type": "application/json"} if body else {}
    async with http.request(method, url + path, data=body or None, headers=headers) as r:
        await r.read()
        if r.status != status:
            raise RuntimeError(f"{name}: HTTP {r.status}, not {status}")


async def wave(
    http: aiohttp.ClientSession,
    route: go.Route | str,
    n: int,
    server: go.Server,
    *,
    bare: gf.BareRelay | None,
) -> Wave:
    """Serve's CPU (the bare relay's, for its side) and the wall time over `n` requests one after another;
    raises on the first failure."""
    pid = server.proc.pid
    cpu0, loop0, t0 = server.cpu_s(), loop_cpu_s(pid), time.perf_counter()
    bare0 = bare.cpu_s() if bare is not None else 0.0
    for _ in range(n):
        if isinstance(route, str):
            await plain(http, server.url, route)
            continue
        got = await go.attempt(http, route)
        if isinstance(got, str):
            raise RuntimeError(f"{route.name}: {got}")
    if bare is not None:  # nothing else runs in its process: no background to take off
        used = bare.cpu_s() - bare0
        return Wave(used, used, time.perf_counter() - t0)
    return Wave(server.cpu_s() - cpu0, loop_cpu_s(pid) - loop0, time.perf_counter() - t0)


async def bench(args: argparse.Namespace, server: go.Server) -> dict[str, list[tuple[float, float]]]:
    timeout = aiohttp.ClientTimeout(total=600)
    names = [n for n in ("openai", "anthropic", *LAYERS, "bare") if not args.sides or n in args.sides]
    per_request: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    async with (
        aiohttp.ClientSession(timeout=timeout) as admin,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), timeout=timeout) as d,
        aiohttp.ClientSession(timeout=timeout) as g,  # a client keeps its connection, as SDKs do
    ):
        engine = await go.load_model(admin, server, args.model)
        relay = gf.BareRelay(engine) if "bare" in names else None
        sides: list[go.Route | str] = [
            *routes(args.model, engine=engine, gateway=server.url, tokens=args.tokens),
            *LAYERS,
        ]
        if relay is not None:
            body = json.dumps(sf.openai_body(args.model, PROMPT, args.tokens, grammar=True)).encode()
            sides.append(go.Route("bare", relay.url + sf.ROUTES["openai"], body, "openai", "bare"))
        if args.sides:  # the direct side stays: it is every round's background rate
            sides = [s for s in sides if (s if isinstance(s, str) else s.name) in {"direct", *args.sides}]
        try:
            await _rounds(args, server, sides, per_request, sessions=(d, g), relay=relay)
        finally:
            if relay is not None:
                relay.stop()
    return per_request


async def _rounds(
    args: argparse.Namespace,
    server: go.Server,
    sides: list[go.Route | str],
    per_request: dict[str, list[tuple[float, float]]],
    *,
    sessions: tuple[aiohttp.ClientSession, aiohttp.ClientSession],
    relay: gf.BareRelay | None,
) -> None:
    d, g = sessions
    for rnd in range(args.rounds + 1):  # round 0 warms up
        k = rnd % len(sides)
        got: dict[str, Wave] = {}
        for route in sides[k:] + sides[:k]:
            name = route if isinstance(route, str) else route.name
            # the bare relay ends each client connection with the engine's: a fresh one each time
            http = d if name in ("direct", "bare") else g
            meter = relay if name == "bare" else None
            got[name] = await wave(http, route, args.requests, server, bare=meter)
        if rnd == 0:
            if args.cprofile is not None:
                os.kill(server.proc.pid, signal.SIGUSR1)
            continue
        base = got["direct"]
        line = [f"round {rnd}: load {os.getloadavg()[0]:4.1f}"]
        for name in per_request:
            w = got[name]
            idle, idle_loop = (0.0, 0.0) if name == "bare" else (base.cpu_s, base.loop_s)
            us = 1e6 * (w.cpu_s - idle / base.wall_s * w.wall_s) / args.requests
            loop_us = 1e6 * (w.loop_s - idle_loop / base.wall_s * w.wall_s) / args.requests
            per_request[name].append((us, loop_us))
            wall_ms = 1000 * w.wall_s / args.requests
            line.append(f"{name} {us:5.0f} us (loop {loop_us:5.0f}, {wall_ms:5.1f} ms wall)")
        print(" | ".join(line), flush=True)
    if args.cprofile is not None:
        os.kill(server.proc.pid, signal.SIGUSR2)
        await asyncio.sleep(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(go.MODEL_MAX_TOKENS), default="medium")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=40, help="requests per wave, one after another")
    ap.add_argument("--tokens", type=int, default=1, help="letters per answer (1: the request alone)")
    ap.add_argument("--parallel", type=int, default=4, help="engine slots")
    ap.add_argument(
        "--sides",
        type=lambda v: [x for x in v.split(",") if x],
        default=[],
        help="only these sides besides direct (openai,anthropic,health,refused,bare; default all)",
    )
    ap.add_argument("--profile", type=Path, help="write py-spy's collapsed stacks of serve to this file")
    ap.add_argument("--cprofile", type=Path, help="run serve under cProfile, its stats written to this file")
    args = ap.parse_args(argv)
    gw_peers.CPROFILE_CODE = CPROFILE_CPU_CODE
    with tempfile.TemporaryDirectory(prefix="sy-request-cost-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        go.write_models(models, {args.model})
        server = go.Server(
            Path(tmp) / "home",
            models,
            parallel=args.parallel,
            threads=0,
            log_level="warning",
            cprofile_to=args.cprofile,
        )
        spy: gw_peers.PySpy | None = None
        try:
            server.wait_ready()
            print(f"switchyard serve at {server.url}; code {go.code_version()}", flush=True)
            if args.profile is not None:
                exe = gw_peers.py_spy()
                if exe is None:
                    raise SystemExit("py-spy could not be installed; run without --profile")
                spy = gw_peers.PySpy(exe, server.proc.pid, args.profile)
            figures = asyncio.run(bench(args, server))
        finally:
            if spy is not None:
                spy.stop()
            server.stop()
    for name, rows in figures.items():
        xs, loops = [r[0] for r in rows], [r[1] for r in rows]
        print(
            f"{name:<10} serve CPU per request: median {statistics.median(xs):5.0f} us (rounds "
            f"{min(xs):.0f}-{max(xs):.0f}), of which the event loop thread {statistics.median(loops):5.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
