"""The gateway against the floor: five sides in one run, interleaved round by round, as ratios.

Per concurrency level (1, 8, 32) and per round, in an order that rotates every round:

- **floor**: `bench/relay_floor.py`'s bare uvloop protocol relay (one wake-up and one `transport.write`
  per event, no HTTP) forwarding `--floor-events` SSE-sized events 1 ms apart; its CPU per event is what
  one wake-up and one send cost on this machine right now;
- **bare**: the same relay in front of the engine itself (both ways, nothing parsed), sent the same wave
  as the gateway sides: its CPU per event is what a wake-up and a send cost on the real stream, beside
  the engine's compute (the synthetic floor runs while the engine is idle, and on a 2-core machine whose
  engine computes on both cores a wake-up there costs two to three times as much); its TTFT and
  throughput against direct's are what any relay in its own process costs here;
- **direct**: a wave of c identical streamed chat requests to the engine's own port;
- **openai**: the same wave through the gateway's `/v1/chat/completions` (the byte relay);
- **anthropic**: the equivalent wave through `/v1/messages` (the translated stream).

Every request is forced to the same length by a grammar (exactly N letters, one token per event), so the
three request sides generate the same tokens. Per round: the gateway's CPU per forwarded event (serve's
CPU over its wave minus serve's idle rate over the direct wave, over the wave's content events) divided by
the floor's of the same round, and by the bare relay's; the added TTFT p50 against the direct wave of the
same round; throughput over direct's. Beside each round: the 1-minute load average and the share of the
machine's CPU that processes outside this benchmark used during the round (/proc/stat minus the
benchmark, serve, the engine and both relays). A round where that share is over `--quiet-share` is
marked LOADED and left out of the headline figure (the median over quiet rounds); when every round is
loaded the figure is printed, but marked as loaded and judged by nothing.

    .venv/bin/python bench/gateway_floor.py                       # c = 1, 8, 32; 8 rounds each (~4 min quiet)
    .venv/bin/python bench/gateway_floor.py --rounds 3 --concurrency 1,8
    .venv/bin/python bench/gateway_floor.py --threads 1     # the engine on one core, the other left to relays
    .venv/bin/python bench/gateway_floor.py --profile /tmp/serve-stacks.txt   # py-spy stacks of serve

Exits 0 whatever the verdict: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import aiohttp
import gateway_overhead as go
import gw_peers
import gw_surfaces as sf
import relay_floor

SIDES = ("direct", "openai", "anthropic")
TARGET_FLOOR_X = {"openai": 1.5, "anthropic": 3.0}  # gateway CPU per event / floor's, at most
TARGET_TTFT_MS = {1: 1.0, 32: 2.0}  # added p50 TTFT, at most
TARGET_TPUT = 0.98  # gateway tok/s / direct tok/s, at least
PROMPT = "Write a long story about a lighthouse keeper and the sea."


# ---- the floor at concurrency c ----------------------------------------------------------------------
def floor_relay(listen_port: int, upstream_port: int, streams: int) -> None:
    """relay_floor.py's uvloop relay for `streams` clients at once: each client's stream forwarded from its
    own upstream connection by `transport.write` in `data_received`, nothing else."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        left = [streams]
        done: asyncio.Future[None] = loop.create_future()

        class Up(asyncio.Protocol):
            def __init__(self, down: asyncio.Transport) -> None:
                self.down = down

            def data_received(self, data: bytes) -> None:
                self.down.write(data)

            def connection_lost(self, exc: Exception | None) -> None:
                self.down.close()
                left[0] -= 1
                if not left[0] and not done.done():
                    done.set_result(None)

        connecting: set[asyncio.Task[object]] = set()

        class Down(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                down = cast(asyncio.Transport, transport)
                task = loop.create_task(loop.create_connection(lambda: Up(down), "127.0.0.1", upstream_port))
                connecting.add(task)
                task.add_done_callback(connecting.discard)

        server = await loop.create_server(Down, "127.0.0.1", listen_port)
        print("ready", flush=True)
        await done
        server.close()
        print(relay_floor.cpu_s(os.getpid()), flush=True)  # its own CPU, read before it exits

    uvloop.run(main())


def bare_relay(listen_port: int, upstream_port: int) -> None:
    """The same bare uvloop relay in front of the engine itself, both ways: every client connection gets
    its own engine connection and every byte is passed on as it arrives, nothing parsed. Its CPU per
    event on the waves sent through it is the floor for the real stream, taken beside the engine's own
    work (its compute threads share the cores with the relay, as they do with the gateway), where the
    synthetic floor runs while the engine is idle."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()

        opening: set[asyncio.Task[None]] = set()

        class Pipe(asyncio.Protocol):
            def __init__(self, other: asyncio.Transport | None = None) -> None:
                self.other = other
                self.pending: list[bytes] = []
                self.transport: asyncio.Transport | None = None

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = cast(asyncio.Transport, transport)
                if self.other is None:  # a client: open its engine connection
                    opening.add(task := loop.create_task(self._open()))
                    task.add_done_callback(opening.discard)

            async def _open(self) -> None:
                assert self.transport is not None
                _, up = await loop.create_connection(lambda: Pipe(self.transport), "127.0.0.1", upstream_port)
                self.other = up.transport
                for data in self.pending:
                    up.transport.write(data)  # type: ignore[union-attr]
                self.pending.clear()

            def data_received(self, data: bytes) -> None:
                if self.other is None:
                    self.pending.append(data)
                else:
                    self.other.write(data)

            def connection_lost(self, exc: Exception | None) -> None:
                if self.other is not None:
                    self.other.close()

        server = await loop.create_server(Pipe, "127.0.0.1", listen_port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


class BareRelay:
    """`bare_relay` running in its own process for the whole run."""

    def __init__(self, engine_url: str) -> None:
        import subprocess

        self.port = gw_peers.free_port()
        upstream = int(engine_url.rsplit(":", 1)[1].split("/", 1)[0])
        argv = [sys.executable, __file__, "--bare-relay", str(self.port), str(upstream)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        return relay_floor.cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def floor_round(events: int, gap_s: float, streams: int) -> float:
    """The floor relay's CPU per forwarded event with `streams` streams, each `events` events `gap_s`
    apart, written in ticks (one event to every stream, as an engine's batch step yields one token each)."""
    import socket
    import subprocess
    import threading

    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(streams)
    listen_port = gw_peers.free_port()
    argv = [
        sys.executable,
        __file__,
        "--floor-relay",
        str(listen_port),
        str(up.getsockname()[1]),
        str(streams),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        got: list[int] = []
        readers = [
            threading.Thread(target=lambda: got.append(relay_floor.read_all(listen_port)))
            for _ in range(streams)
        ]
        for r in readers:
            r.start()
        conns = []
        for _ in range(streams):
            conn, _ = up.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append(conn)
        before = relay_floor.cpu_s(proc.pid)
        next_at = time.perf_counter()
        for _ in range(events):
            for conn in conns:
                conn.sendall(relay_floor.EVENT)
            next_at += gap_s
            time.sleep(max(0.0, next_at - time.perf_counter()))
        for conn in conns:
            conn.close()
        for r in readers:
            r.join()
        after = float(proc.stdout.readline())  # the relay's CPU once every stream ended
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        up.close()
    assert got == [events * len(relay_floor.EVENT)] * streams, got
    return (after - before) / (events * streams) * 1e6


@dataclass(frozen=True)
class RoundFigures:
    """One round of one concurrency level: the floor, and per gateway side its ratios."""

    rnd: int
    load1: float  # 1-minute load average at the end of the round
    foreign: float  # share of the machine's CPU used by processes outside the benchmark (0..1)
    floor_us: float
    bare_us: float  # the bare relay in front of the engine: CPU per event of the same stream
    bare_ttft_ms: float
    bare_tput: float
    cpu_us: dict[str, float]  # gateway side -> serve CPU per forwarded event
    added_ttft_ms: dict[str, float]
    tput: dict[str, float]  # gateway side -> tok/s over direct's

    def loaded(self, limit: float) -> bool:
        return self.foreign > limit


@dataclass
class Level:
    concurrency: int
    rounds: list[RoundFigures] = field(default_factory=list)


class Accounting:
    """CPU seconds of everything this benchmark runs, to tell its own use of the machine from others'."""

    def __init__(self, server: go.Server) -> None:
        self.server = server
        self.extra: list[int] = []  # the bare relay's process

    def own_s(self) -> float:
        t = os.times()  # this process, and the floor relays it waited for
        pids = [self.server.proc.pid, *self.server.engine_pids, *self.extra]
        return t.user + t.system + t.children_user + t.children_system + gw_peers.tree_cpu_s(pids)


def foreign_share(ticks0: list[int], ticks1: list[int], own_s: float) -> float:
    """The share of the machine's CPU (0..1) used by others between two /proc/stat readings."""
    if len(ticks0) < 8 or len(ticks1) < 8:
        return float("nan")
    d = [b - a for a, b in zip(ticks0, ticks1, strict=False)]
    total = sum(d[:8]) or 1
    busy = total - d[3] - d[4] - d[7]  # not idle, iowait or stolen
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, busy - own_s * hz) / total


def make_routes(model: str, *, engine: str, gateway: str, bare: str, tokens: int) -> list[go.Route]:
    direct = json.dumps(sf.openai_body(model, PROMPT, tokens, grammar=True)).encode()
    anthropic = sf.surface_body("anthropic", model, PROMPT, tokens, grammar=True)
    return [
        go.Route("direct", engine + sf.ROUTES["openai"], direct, "openai", "serve"),
        go.Route("bare", bare + sf.ROUTES["openai"], direct, "openai", "bare"),
        go.Route("openai", gateway + sf.ROUTES["openai"], direct, "openai", "serve"),
        go.Route("anthropic", gateway + sf.ROUTES["anthropic"], anthropic, "anthropic", "serve"),
    ]


async def run_level(
    sessions: dict[str, aiohttp.ClientSession],
    routes: list[go.Route],
    *,
    c: int,
    args: argparse.Namespace,
    acct: Accounting,
    bare: BareRelay,
) -> Level:
    meters: go.Meters = {"serve": acct.server.cpu_s, "bare": bare.cpu_s}
    sides = {r.name: go.Side(meter=r.meter) for r in routes}
    level = Level(c)
    order: list[go.Route | None] = [None, *routes]  # None: the floor
    for rnd in range(args.rounds + 1):  # round 0 warms up
        ticks0, own0 = go.cpu_ticks(), acct.own_s()
        k = rnd % len(order)
        floor_us = float("nan")
        for step in order[k:] + order[:k]:
            if step is None:
                gap = args.floor_gap_ms / 1000
                events = max(1, args.floor_events // c)  # the same number of events at every level
                floor_us = await asyncio.to_thread(floor_round, events, gap, c)
                continue
            session = sessions["gateway" if step.name in ("openai", "anthropic") else "direct"]
            await wave(
                session,
                step,
                c=c,
                batches=max(1, args.per_wave // c),
                meters=meters,
                side=sides[step.name],
                rnd=rnd,
            )
        share = foreign_share(ticks0, go.cpu_ticks(), acct.own_s() - own0)
        d = sides["direct"].rounds.get(rnd)
        if rnd == 0 or d is None:
            continue  # a warm-up, or a round whose direct wave failed: nothing to pair against
        cpu, ttft, tput = {}, {}, {}
        for name in ("openai", "anthropic"):
            g = sides[name].rounds.get(rnd)
            if g is None or not g.events or not d.wall_s:
                continue
            idle = d.cpu_s["serve"] / d.wall_s * g.wall_s  # serve's own background, not the relay's
            cpu[name] = 1e6 * (g.cpu_s["serve"] - idle) / g.events
            ttft[name] = 1000 * (g.ttft_s - d.ttft_s)
            tput[name] = g.tok_s / d.tok_s
        b = sides["bare"].rounds.get(rnd)
        bare_us, bare_ttft, bare_tput = (
            (1e6 * b.cpu_s["bare"] / b.events, 1000 * (b.ttft_s - d.ttft_s), b.tok_s / d.tok_s)
            if b is not None and b.events
            else (float("nan"),) * 3
        )
        figures = RoundFigures(
            rnd, os.getloadavg()[0], share, floor_us, bare_us, bare_ttft, bare_tput, cpu, ttft, tput
        )
        level.rounds.append(figures)
        print_round(c, figures, args.quiet_share)
    for name, side in sides.items():
        if side.errors:
            print(f"  c={c} {name}: {len(side.errors)} failed request(s), e.g. {side.errors[0][:200]}")
    return level


async def wave(
    http: aiohttp.ClientSession,
    route: go.Route,
    *,
    c: int,
    batches: int,
    meters: go.Meters,
    side: go.Side,
    rnd: int,
) -> None:
    """`batches` groups of `c` requests at once, one group after the other, timed as one wave into `side`
    (so that a c=1 round holds several requests, not one); round 0 and waves with a failure are not timed."""
    cpu0 = {k: f() for k, f in meters.items()}
    t0 = time.perf_counter()
    done: list[go.Sample | str] = []
    for _ in range(batches):
        done += await asyncio.gather(*(go.attempt(http, route) for _ in range(c)))
    wall = time.perf_counter() - t0
    cpu = {k: f() - cpu0[k] for k, f in meters.items()}
    failed = [x for x in done if isinstance(x, str)]
    samples = [x for x in done if isinstance(x, go.Sample)]
    side.errors.extend(failed)
    if rnd > 0 and not failed:
        tokens = sum(x.tokens for x in samples)
        events = sum(x.events for x in samples)
        ttft = go.pct([x.ttft_s for x in samples], 0.5)
        side.rounds[rnd] = go.Round(tok_s=tokens / wall, ttft_s=ttft, wall_s=wall, events=events, cpu_s=cpu)


def print_round(c: int, f: RoundFigures, limit: float) -> None:
    parts = [
        f"c={c:<3} round {f.rnd:>2}: floor {f.floor_us:6.1f} us | bare relay {f.bare_us:6.1f} us, "
        f"+TTFT {f.bare_ttft_ms:6.2f} ms, tput {f.bare_tput:5.3f}"
    ]
    for name in ("openai", "anthropic"):
        if name in f.cpu_us:
            parts.append(
                f"{name} {f.cpu_us[name]:6.1f} us = {f.cpu_us[name] / f.floor_us:4.2f}x floor "
                f"{f.cpu_us[name] / f.bare_us:4.2f}x bare, "
                f"+TTFT {f.added_ttft_ms[name]:6.2f} ms, tput {f.tput[name]:5.3f}"
            )
    mark = "LOADED" if f.loaded(limit) else "quiet"
    parts.append(f"load {f.load1:4.2f}, others {100 * f.foreign:3.0f}% of the CPU: {mark}")
    print(" | ".join(parts), flush=True)


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # NaN out
    return statistics.median(xs) if xs else float("nan")


def summarize(levels: list[Level], limit: float) -> None:
    print(
        "\nmedians over the quiet rounds of each level (the figure); where every round was loaded, over "
        "all rounds, marked LOADED and not judged"
    )
    head = (
        f"{'c':>3} {'side':<10}{'rounds':>9}{'load':>11}{'floor us':>10}{'bare us':>9}{'gw us/ev':>10}"
        f"{'x floor':>9}{'x bare':>8}{'+TTFT ms':>10}{'tput':>8}  verdict"
    )
    print(head)
    print("-" * len(head))
    for lv in levels:
        quiet = [r for r in lv.rounds if not r.loaded(limit)]
        used = quiet or lv.rounds
        loads = [r.load1 for r in used]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        if used:  # what any relay in its own process costs here: the bare one's own TTFT and throughput
            floor, bare = _median([r.floor_us for r in used]), _median([r.bare_us for r in used])
            ratio = _median([r.bare_us / r.floor_us for r in used])
            ttft, tput = _median([r.bare_ttft_ms for r in used]), _median([r.bare_tput for r in used])
            print(
                f"{lv.concurrency:>3} {'bare':<10}{len(quiet):>3}/{len(lv.rounds):<2} q{load:>11}"
                f"{floor:>10.1f}{bare:>9.1f}{'':>10}{ratio:>9.2f}{'':>8}{ttft:>10.2f}{tput:>8.3f}"
                "  (no target: the relay every gateway side is read against)"
            )
        for name in ("openai", "anthropic"):
            rows = [r for r in used if name in r.cpu_us]
            if not rows:
                continue
            floor = _median([r.floor_us for r in rows])
            bare = _median([r.bare_us for r in rows])
            cpu = _median([r.cpu_us[name] for r in rows])
            ratio = _median([r.cpu_us[name] / r.floor_us for r in rows])
            ratio_bare = _median([r.cpu_us[name] / r.bare_us for r in rows])
            ttft = _median([r.added_ttft_ms[name] for r in rows])
            tput = _median([r.tput[name] for r in rows])
            verdict = (
                verdicts(lv.concurrency, name, ratio, ratio_bare, ttft, tput)
                if quiet
                else "LOADED: not judged"
            )
            print(
                f"{lv.concurrency:>3} {name:<10}{len(quiet):>3}/{len(lv.rounds):<2} q{load:>11}{floor:>10.1f}"
                f"{bare:>9.1f}{cpu:>10.1f}{ratio:>9.2f}{ratio_bare:>8.2f}{ttft:>10.2f}{tput:>8.3f}  {verdict}"
            )
    print(
        "floor = bare uvloop relay CPU per event on synthetic events while the engine is idle\n"
        "(relay_floor.py, same round); bare = the same relay in front of the engine, on the same requests\n"
        "as the gateway (CPU per event of the real stream, beside the engine's compute); x bare = gateway /\n"
        "bare, per round; gw us/ev = serve CPU per\n"
        "forwarded content event (its idle rate over the direct wave taken off); x floor = the per-round\n"
        "ratio's median; +TTFT = gateway TTFT p50 - direct TTFT p50 of the same round; tput = gateway tok/s\n"
        "/ direct tok/s of the same round; rounds = quiet/all"
    )


def verdicts(c: int, side: str, ratio: float, ratio_bare: float, ttft: float, tput: float) -> str:
    want_x = TARGET_FLOOR_X[side]
    out = [
        f"CPU {'PASS' if ratio <= want_x else 'MISS'} (<= {want_x:g}x floor), "
        f"{'PASS' if ratio_bare <= want_x else 'MISS'} (<= {want_x:g}x bare)"
    ]
    if c in TARGET_TTFT_MS:
        want = TARGET_TTFT_MS[c]
        out.append(f"TTFT {'PASS' if ttft <= want else 'MISS'} (<= {want:g} ms)")
    out.append(f"tput {'PASS' if tput >= TARGET_TPUT else 'MISS'} (>= {TARGET_TPUT:g})")
    return "; ".join(out)


async def bench(args: argparse.Namespace, server: go.Server) -> list[Level]:
    timeout = aiohttp.ClientTimeout(total=600)
    acct = Accounting(server)
    levels: list[Level] = []
    # the engine closes a streamed connection after its answer: the direct side reconnects each time;
    # the gateway's client keeps its connection alive, as an ordinary client does
    async with (
        aiohttp.ClientSession(timeout=timeout) as admin,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=timeout
        ) as d,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as g,
    ):
        engine = await go.load_model(admin, server, args.model)
        print(f"loaded {args.model}; engine at {engine}", flush=True)
        tokens = go.MODEL_MAX_TOKENS[args.model]
        bare = BareRelay(engine)
        acct.extra.append(bare.proc.pid)
        try:
            routes = make_routes(args.model, engine=engine, gateway=server.url, bare=bare.url, tokens=tokens)
            for c in (int(x) for x in args.concurrency.split(",")):
                levels.append(
                    await run_level({"direct": d, "gateway": g}, routes, c=c, args=args, acct=acct, bare=bare)
                )
        finally:
            bare.stop()
    return levels


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(go.MODEL_MAX_TOKENS), default="medium")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds per level, after a warm-up")
    ap.add_argument(
        "--per-wave", type=int, default=8, help="requests per wave at least: c=1 sends 8 one after another"
    )
    ap.add_argument("--floor-events", type=int, default=500)
    ap.add_argument("--floor-gap-ms", type=float, default=1.0)
    ap.add_argument("--parallel", type=int, default=32, help="engine slots")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="engine CPU threads (default 0: every core the engine may use; 1 on this 2-core machine leaves "
        "a core to the relays, as a GPU engine would)",
    )
    ap.add_argument(
        "--quiet-share",
        type=float,
        default=0.10,
        help="a round where others used more than this share of the CPU is LOADED (default 0.10)",
    )
    ap.add_argument(
        "--floor-relay", nargs=3, metavar=("LISTEN", "UPSTREAM", "STREAMS"), help=argparse.SUPPRESS
    )
    ap.add_argument("--bare-relay", nargs=2, metavar=("LISTEN", "UPSTREAM"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=Path, help="write py-spy's collapsed stacks of serve to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.floor_relay:
        floor_relay(*(int(x) for x in args.floor_relay))
        return 0
    if args.bare_relay:
        bare_relay(*(int(x) for x in args.bare_relay))
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sy-floor-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        go.write_models(models, {args.model})
        server = go.Server(
            Path(tmp) / "home", models, parallel=args.parallel, threads=args.threads, log_level="warning"
        )
        spy: gw_peers.PySpy | None = None
        try:
            server.wait_ready()
            print(f"switchyard serve at {server.url}; {os.cpu_count()} CPUs; code {go.code_version()}")
            if args.profile is not None:
                exe = gw_peers.py_spy()
                if exe is None:
                    raise SystemExit("py-spy could not be installed; run without --profile")
                spy = gw_peers.PySpy(exe, server.proc.pid, args.profile)
            levels = asyncio.run(bench(args, server))
        except BaseException:
            print(f"--- serve stderr (tail) ---\n{server.log_path.read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            if spy is not None:
                spy.stop()
            rc, left = server.stop()
            print(f"server stopped (exit {rc}); engine processes left: {left or 'none'}")
    summarize(levels, args.quiet_share)
    print(f"\ntotal run time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
