"""What the gateway costs a streaming chat completion: the same request, direct to the engine and through it.

One run generates its models, starts a real `switchyard serve`, loads a model, reads the engine's own port
from GET /api/lanes, and sends identical streaming chat completions (``ignore_eos`` and a fixed
``max_tokens``, so every request generates the same number of tokens) to the engine and to the gateway,
interleaved: request by request at concurrency 1, wave by wave (c requests at once) above it, with the order
of the sides rotating every round, so machine noise lands on all sides alike. Round 0 is a warm-up.

Measured on the client, per request: time to first token (the first event with content) and the gaps
between content events; per side: aggregate completion tokens per second (tokens / summed wave wall time).
The serve process's CPU time (all threads, /proc/<pid>/task/*/schedstat) is sampled around every wave.
Gateway CPU per forwarded event, per round: its CPU over the gateway wave minus its CPU rate over the
adjacent direct wave (when it is not in the path) times the gateway wave's wall time, divided by the
content events of the gateway wave; the median over rounds is reported.

    .venv/bin/python bench/gateway_overhead.py                 # full run (about 4-5 minutes, quiet 2 cores)
    .venv/bin/python bench/gateway_overhead.py --quick         # a short smoke run
    .venv/bin/python bench/gateway_overhead.py --small-slots   # 256-token slots: the gateway counts prompts
    .venv/bin/python bench/gateway_overhead.py --surfaces      # Anthropic, Responses, Ollama routes
    .venv/bin/python bench/gateway_overhead.py --peer litellm --models large   # LiteLLM as a third side
    .venv/bin/python bench/gateway_overhead.py --profile --models medium       # top functions per event

Ratios are printed pooled (over all waves of a side) and paired (per round, from its adjacent waves, then
the median over rounds); the paired figures shrug off bursts of foreign load and carry the verdicts.
Exits 0 whatever the verdict: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import gw_peers
import gw_surfaces as sf
import psutil

REPO = Path(__file__).resolve().parent.parent
# paired throughput gateway/direct, by model; the medium model is reported, not judged
TARGET_RATIO = {"large": 0.99, "tiny": 0.95}
TARGET_TTFT_MS = {1: 0.5, 32: 2.0}  # added paired TTFT p50, by concurrency
TARGET_CPU_US = {"openai": 25.0, "translated": 60.0}  # gateway CPU per forwarded event
# slots this large skip the gateway's prompt count (body bytes + template allowance < slot); 256-token
# slots (--small-slots) make it count every prompt: two more engine calls per request
CTX_PER_SLOT = 2048
SMALL_CTX_PER_SLOT = 256
PROMPT = "Write a long story about a lighthouse keeper and the sea."
MODEL_MAX_TOKENS = {"large": 32, "medium": 64, "tiny": 64}


# ---- measurement records ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    ttft_s: float
    gaps_s: tuple[float, ...]
    tokens: int
    events: int


@dataclass(frozen=True)
class Round:
    """One recorded wave of a side: what the paired figures are computed from."""

    tok_s: float
    ttft_s: float  # p50 over the wave's requests
    wall_s: float
    events: int
    cpu_s: dict[str, float]  # meter (serve, litellm) -> CPU seconds over the wave


@dataclass(frozen=True)
class Route:
    """One path a case sends requests along."""

    name: str  # direct, gateway or litellm
    url: str
    body: bytes
    surface: str
    meter: str  # the process whose CPU is this path's cost
    headers: dict[str, str] = field(default_factory=dict)


Meters = dict[str, Callable[[], float]]


@dataclass
class Side:
    """Everything measured on one path (direct or gateway) for one case."""

    meter: str = "serve"
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0
    server_cpu_s: float = 0.0  # of this side's meter, recorded waves only
    errors: list[str] = field(default_factory=list)  # warm-up included
    sent: int = 0  # warm-up included
    events_all: int = 0  # warm-up included: what a profile of the whole run is divided by
    rounds: dict[int, Round] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else math.nan

    @property
    def events(self) -> int:
        return sum(s.events for s in self.samples)

    def ttft_ms(self, q: float) -> float:
        return 1000 * pct([s.ttft_s for s in self.samples], q)

    def gap_ms(self, q: float) -> float:
        return 1000 * pct([g for s in self.samples for g in s.gaps_s], q)

    def cpu_us_per_event(self) -> float:
        return 1e6 * self.server_cpu_s / self.events if self.events else math.nan


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    max_tokens: int
    concurrency: int
    requests: int  # per side, rounded up to whole waves
    surface: str = "openai"
    grammar: bool = False  # force the length with a grammar instead of ignore_eos
    peer: bool = False  # LiteLLM as a third side


Result = tuple[Case, dict[str, Side]]


def cpu_ticks() -> list[int]:
    """The machine-wide `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def code_version() -> str:
    """The commit under test (with -dirty when the work tree differs), for the record."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown (not a git checkout)"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def own_cpu_s() -> float:
    """CPU time of this process and of its waited-for children (serve, and the engines serve waited for)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def describe_cpu(before: list[int], after: list[int], own_s: float) -> str:
    """Machine CPU use over the run, and how much of it was not this benchmark's (a shared machine)."""
    if len(before) < 8 or len(after) < 8:
        return "machine CPU use: unknown (no /proc/stat)"
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d[:8]) or 1
    busy = total - d[3] - d[4] - d[7]
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    foreign = max(0.0, busy / hz - own_s)
    line = (
        f"machine CPU over the measured part: {100 * busy / total:.0f}% busy, {100 * d[7] / total:.1f}% "
        f"stolen by the host, {100 * foreign * hz / total:.0f}% used by processes outside this benchmark"
    )
    if foreign * hz / total > 0.05:
        line += (
            "\nWARNING: the machine was shared while this ran; absolute figures and pooled ratios are noisy"
        )
    return line


def paired(d: Side, g: Side) -> tuple[float, float]:
    """Median over rounds of (gateway/direct tok/s, gateway - direct TTFT p50 in ms), adjacent waves only."""
    both = sorted(set(d.rounds) & set(g.rounds))
    ratios = [g.rounds[r].tok_s / d.rounds[r].tok_s for r in both]
    added = [1000 * (g.rounds[r].ttft_s - d.rounds[r].ttft_s) for r in both]
    return pct(ratios, 0.5), pct(added, 0.5)


def added_cpu_us(d: Side, g: Side) -> float:
    """Median over rounds of the CPU `g` adds per content event, in µs, on g's own meter.

    Per round: g's meter over g's wave, minus that meter's rate over the direct wave (the proxy idles
    then: supervising, reading engine logs) times g's wall time, over g's content events."""
    out = []
    for r in sorted(set(d.rounds) & set(g.rounds)):
        dr, gr = d.rounds[r], g.rounds[r]
        if gr.events and dr.wall_s:
            idle = dr.cpu_s[g.meter] / dr.wall_s * gr.wall_s
            out.append(1e6 * (gr.cpu_s[g.meter] - idle) / gr.events)
    return pct(out, 0.5)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ---- the server under test ---------------------------------------------------------------------------
class Server:
    """A real `python -m app serve` child in its own SWITCHYARD_HOME and its own session."""

    def __init__(
        self,
        home: Path,
        models_dir: Path,
        *,
        parallel: int,
        threads: int,
        log_level: str,
        slot_ctx: int = CTX_PER_SLOT,
        cprofile_to: Path | None = None,
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHONUNBUFFERED="1")
        # cProfile wraps the same entry point `python -m app` runs, imported from the same cwd
        start = [sys.executable, "-m", "app"]
        if cprofile_to is not None:
            start = [sys.executable, "-c", gw_peers.CPROFILE_CODE, str(cprofile_to)]
        argv = [
            *start, "serve", "--port", "0", "--models-dir", str(models_dir),
            "--parallel", str(parallel), "--ctx-size", str(parallel * slot_ctx), "--log-level", log_level,
        ]  # fmt: skip
        if threads:
            argv += ["--threads", str(threads)]
        self.log_path = home / "serve-stderr.log"
        self.lane_logs = home / "logs" / "lanes"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        self.ps = psutil.Process(self.proc.pid)
        self.url = ""
        self.engine_pids: set[int] = set()
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("listening on "):
                self.url = line.split()[-1]
                self._ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"switchyard serve did not start:\n{self.log_path.read_text()[-2000:]}")

    def engine_log_lines(self, model: str) -> int:
        """Lines of engine output the gateway has read and written to the lane's log so far."""
        try:
            with (self.lane_logs / f"{model}.log").open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def cpu_s(self) -> float:
        """CPU time of the serve process, all threads: schedstat (ns) on Linux; psutil ticks are 10 ms."""
        if Path(f"/proc/{self.proc.pid}/task").is_dir():
            return gw_peers.tree_cpu_s([self.proc.pid])
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def stop(self, timeout: float = 20) -> tuple[int | None, list[int]]:
        """SIGTERM and wait; returns the exit code and the engine pids that outlived it (then killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        left = []
        deadline = time.monotonic() + 10
        for pid in sorted(self.engine_pids):
            while _engine_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _engine_alive(pid):
                left.append(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # the engine leads its own process group
        return self.proc.returncode, left


def app_origin() -> str:
    """Where `python -m app` resolves `app` from, run as the server is (same python, same cwd)."""
    out = subprocess.run(
        [sys.executable, "-c", "import app; print(app.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return str(Path(out.stdout.strip()).parent) if out.returncode == 0 else "unknown"


def counts_prompt(body: bytes, slot_ctx: int) -> str:
    """Whether the checkout's gateway would count this prompt (its own rule: app.server.gateway.core since the
    one-gateway rebuild, app.server.limits before it)."""
    import importlib

    may_exceed = None
    for module in ("app.server.gateway.core", "app.server.limits"):
        try:
            may_exceed = getattr(importlib.import_module(module), "may_exceed", None)
        except ImportError:
            continue
        if may_exceed is not None:
            break
    if may_exceed is None:
        return "unknown (no may_exceed in this checkout)"
    messages = len(json.loads(body).get("messages") or [])
    return "yes" if may_exceed(len(body), messages=messages, slot_ctx=slot_ctx) else "no"


def _engine_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and "llamacpp_worker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


async def load_model(http: aiohttp.ClientSession, server: Server, model: str) -> str:
    """Load `model` through the admin API; returns the engine's own base URL."""
    async with http.post(f"{server.url}/api/models/{model}/load") as r:
        if r.status != 200:
            raise RuntimeError(f"loading {model} failed: HTTP {r.status} {await r.text()}")
    async with http.get(f"{server.url}/api/lanes") as r:
        lanes = (await r.json())["lanes"]
    lane = next(ln for ln in lanes if ln["model"] == model and ln["state"] == "ready")
    server.engine_pids.add(int(lane["pid"]))
    return f"http://127.0.0.1:{lane['port']}"


# ---- the client ------------------------------------------------------------------------------------
class RequestFailed(Exception):
    """A request that did not stream its tokens: counted and reported, not timed."""


async def one_request(http: aiohttp.ClientSession, route: Route) -> Sample:
    """One streamed request, read to the end; timestamps every event with content."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    headers = route.headers or sf.HEADERS[route.surface]
    async with http.post(route.url, data=route.body, headers=headers) as resp:
        if resp.status != 200:
            raise RequestFailed(f"{route.url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        # read to EOF (not just the last event) so a keep-alive connection can be reused
        async for line in resp.content:
            now = time.perf_counter()
            kind, n = sf.classify(route.surface, line)
            if kind == sf.CONTENT:
                stamps.append(now)
            elif kind == sf.TOKENS:
                tokens = n
            elif kind == sf.ERROR:
                raise RequestFailed(f"{route.url}: error event: {line[:300]!r}")
    if not stamps:
        raise RequestFailed(f"{route.url}: the stream carried no content")
    gaps = tuple(b - a for a, b in itertools.pairwise(stamps))
    return Sample(ttft_s=stamps[0] - t0, gaps_s=gaps, tokens=tokens or len(stamps), events=len(stamps))


async def attempt(http: aiohttp.ClientSession, route: Route) -> Sample | str:
    try:
        return await one_request(http, route)
    except (RequestFailed, aiohttp.ClientError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def wave(
    http: aiohttp.ClientSession, route: Route, *, n: int, meters: Meters, side: Side, rnd: int
) -> None:
    """`n` requests at once; timed into `side` unless it is round 0 (warm-up) or a request failed."""
    cpu0 = {k: f() for k, f in meters.items()}
    t0 = time.perf_counter()
    done = await asyncio.gather(*(attempt(http, route) for _ in range(n)))
    wall = time.perf_counter() - t0
    cpu = {k: f() - cpu0[k] for k, f in meters.items()}
    failed = [x for x in done if isinstance(x, str)]
    samples = [x for x in done if isinstance(x, Sample)]
    side.errors.extend(failed)
    side.sent += n
    side.events_all += sum(s.events for s in samples)
    if rnd > 0 and not failed:  # a failed request would skew the wave's timing; it is counted instead
        tokens = sum(s.tokens for s in samples)
        events = sum(s.events for s in samples)
        side.samples.extend(samples)
        side.wall_s += wall
        side.tokens += tokens
        side.server_cpu_s += cpu[side.meter]
        ttft = pct([s.ttft_s for s in samples], 0.5)
        side.rounds[rnd] = Round(tok_s=tokens / wall, ttft_s=ttft, wall_s=wall, events=events, cpu_s=cpu)


async def run_case(
    sessions: dict[str, aiohttp.ClientSession], routes: list[Route], case: Case, meters: Meters
) -> dict[str, Side]:
    sides = {r.name: Side(meter=r.meter) for r in routes}
    waves = max(2, math.ceil(case.requests / case.concurrency))
    for i in range(waves + 1):
        k = i % len(routes)  # rotate who goes first: D G | G D, or D G L | G L D | L D G
        for route in routes[k:] + routes[:k]:
            await wave(
                sessions[route.name],
                route,
                n=case.concurrency,
                meters=meters,
                side=sides[route.name],
                rnd=i,
            )
    return sides


# ---- report ----------------------------------------------------------------------------------------
def print_table(results: list[Result]) -> None:
    head = (
        f"{'model':<7}{'surface':<10}{'conc':>5}  {'path':<8}{'req':>5}{'TTFT p50':>10}{'TTFT p95':>10}"
        f"{'gap p50':>9}{'gap p95':>9}{'tok/s':>9}{'tok/ev':>7}{'CPU/ev':>10}{'err':>5}"
    )
    print(head)
    print("-" * len(head))
    for case, sides in results:
        for name, s in sides.items():
            tok_ev = s.tokens / s.events if s.events else math.nan
            print(
                f"{case.label:<7}{case.surface:<10}{case.concurrency:>5}  {name:<8}{len(s.samples):>5}"
                f"{s.ttft_ms(0.5):>10.2f}{s.ttft_ms(0.95):>10.2f}{s.gap_ms(0.5):>9.2f}{s.gap_ms(0.95):>9.2f}"
                f"{s.tok_s:>9.1f}{tok_ev:>7.2f}{s.cpu_us_per_event():>7.0f} us{len(s.errors):>5}"
            )
    print(
        "times in ms; tok/s = completion tokens / summed wave wall time; tok/ev = tokens per content event;\n"
        "CPU/ev = CPU of that path's process (serve; litellm: its process tree) per content event while the\n"
        "side ran (direct: serve is not in the path); err = failed requests (warm-up included); a wave with\n"
        "a failure is left out of all timings\n"
    )


def verdicts(case: Case, name: str, ratio: float, added_ms: float, cpu_us: float) -> list[str]:
    """PASS/MISS for each target that applies to this case and path (LiteLLM is a peer: none)."""
    if name != "gateway":
        return []
    out = []
    if case.surface == "openai" and case.label in TARGET_RATIO:
        want = TARGET_RATIO[case.label]
        out.append(f"tput {'PASS' if ratio >= want else 'MISS'} (>= {want:g})")
    if case.surface == "openai" and case.concurrency in TARGET_TTFT_MS:
        want = TARGET_TTFT_MS[case.concurrency]
        out.append(f"TTFT {'PASS' if added_ms <= want else 'MISS'} (<= {want:g} ms)")
    want = TARGET_CPU_US["openai" if case.surface == "openai" else "translated"]
    out.append(f"CPU {'PASS' if cpu_us <= want else 'MISS'} (<= {want:g} us)")
    return out


def print_verdicts(results: list[Result]) -> None:
    print(
        f"{'model':<7}{'surface':<10}{'conc':>5}  {'path':<8}{'paired tput':>12}{'paired +TTFT':>14}"
        f"{'pooled tput':>12}{'pooled +TTFT':>14}  {'gateway CPU us per forwarded event':>12}"
    )
    passes = misses = 0
    for case, sides in results:
        d = sides["direct"]
        for name, g in sides.items():
            if name == "direct":
                continue
            ratio, added = g.tok_s / d.tok_s, g.ttft_ms(0.5) - d.ttft_ms(0.5)
            p_ratio, p_added = paired(d, g)
            cpu = added_cpu_us(d, g)
            marks = verdicts(case, name, p_ratio, p_added, cpu)
            passes += sum("PASS" in m for m in marks)
            misses += sum("MISS" in m for m in marks)
            if abs(ratio - p_ratio) > 0.05:
                marks.append("noisy (pooled and paired ratios disagree)")
            print(
                f"{case.label:<7}{case.surface:<10}{case.concurrency:>5}  {name:<8}{p_ratio:>12.3f}"
                f"{p_added:>11.2f} ms{ratio:>12.3f}{added:>11.2f} ms  {cpu:>8.1f} us   {'; '.join(marks)}"
            )
    errors: dict[str, int] = {}
    for case, sides in results:
        for name, side in sides.items():
            for e in side.errors:
                key = f"{case.label} {case.surface} {name}: {e}"
                errors[key] = errors.get(key, 0) + 1
    for msg, count in errors.items():
        print(f"FAILED x{count}  {msg}")
    print(
        f"\ntargets: {passes} PASS, {misses} MISS. Paired (the verdicts) = median over rounds of the figure\n"
        "from the adjacent waves of one round; pooled = over all recorded waves of a side. Gateway CPU per\n"
        "forwarded event = per round, (proxy CPU over its wave - its CPU rate over the direct wave x its\n"
        "wave time) / content events, median over rounds"
    )


# ---- main ------------------------------------------------------------------------------------------
def plan_cases(args: argparse.Namespace) -> list[Case]:
    levels: tuple[int, ...] = (1, 8) if args.quick or args.surfaces else (1, 8, 32)
    if args.concurrency:
        levels = tuple(int(c) for c in args.concurrency.split(","))
    n = args.requests or (8 if args.quick else 48 if args.surfaces else 96)
    waves = 2 if args.quick else 12  # the fewest waves per side
    budget = {"large": args.max_tokens, "medium": args.medium_max_tokens, "tiny": args.tiny_max_tokens}

    def case(model: str, c: int, **kw: object) -> Case:
        return Case(model, model, budget[model], c, max(n, waves * c), **kw)  # type: ignore[arg-type]

    if args.surfaces:
        return [case("medium", c, surface=s, grammar=True) for c in levels for s in sf.SURFACES]
    models = [m for m in args.models.split(",") if m and not (args.no_tiny and m == "tiny")]
    unknown = set(models) - set(budget)
    if unknown:
        raise SystemExit(f"unknown model(s) {sorted(unknown)}; pick from {', '.join(budget)}")
    peer = args.peer == "litellm"
    return [case(m, c, peer=peer and m == "large") for m in models for c in levels]


def write_models(models_dir: Path, names: set[str]) -> None:
    sys.path.insert(0, str(REPO))
    from tests.support import tinymodels

    specs = {"large": tinymodels.LARGE, "medium": tinymodels.MEDIUM, "tiny": tinymodels.CHAT}
    for name in sorted(names):
        tinymodels.write_tiny_gguf(models_dir / f"{name}.gguf", specs[name])


def make_routes(case: Case, *, engine: str, gateway: str, peer: gw_peers.LiteLLM | None) -> list[Route]:
    direct = json.dumps(sf.openai_body(case.model, PROMPT, case.max_tokens, grammar=case.grammar)).encode()
    body = sf.surface_body(case.surface, case.model, PROMPT, case.max_tokens, grammar=case.grammar)
    routes = [
        Route("direct", engine + sf.ROUTES["openai"], direct, "openai", "serve"),
        Route("gateway", gateway + sf.ROUTES[case.surface], body, case.surface, "serve"),
    ]
    if case.peer and peer is not None:
        auth = sf.HEADERS["openai"] | {"Authorization": f"Bearer {peer.key}"}
        url = peer.url + sf.ROUTES["openai"]
        routes.append(Route("litellm", url, direct, "openai", "litellm", headers=auth))
    return routes


def case_note(case: Case, sides: dict[str, Side], slot_ctx: int, body: bytes) -> str:
    """Checks on what the case measured: every request got max_tokens, one token per event or not."""
    short = [n for n, s in sides.items() if any(x.tokens != case.max_tokens for x in s.samples)]
    note = f"; WARNING: token count != max_tokens on {short}" if short else ""
    merged = [n for n, s in sides.items() if any(x.events != x.tokens for x in s.samples)]
    note += f"; events carry more than one token on {merged}" if merged else "; one token per event"
    if case.surface == "openai":
        note += f"; gateway counts the prompt: {counts_prompt(body, slot_ctx)}"
    return note


async def bench(args: argparse.Namespace, server: Server, *, slot_ctx: int, work: Path) -> list[Result]:
    timeout = aiohttp.ClientTimeout(total=600)
    # llama.cpp closes the connection after every streamed response, so the direct side needs a fresh one
    # each time (reusing a pooled one races with that close); the proxies keep them alive like any client
    fresh = aiohttp.TCPConnector(limit=0, force_close=True)
    pooled = aiohttp.TCPConnector(limit=0, force_close=args.gateway_fresh)
    peer_pool = aiohttp.TCPConnector(limit=0, force_close=args.gateway_fresh)
    meters: Meters = {"serve": server.cpu_s}
    peer: gw_peers.LiteLLM | None = None
    results: list[Result] = []
    async with (
        aiohttp.ClientSession(timeout=timeout) as admin,
        aiohttp.ClientSession(connector=fresh, timeout=timeout) as direct,
        aiohttp.ClientSession(connector=pooled, timeout=timeout) as gateway,
        aiohttp.ClientSession(connector=peer_pool, timeout=timeout) as litellm,
    ):
        sessions = {"direct": direct, "gateway": gateway, "litellm": litellm}
        engine, loaded = "", ""
        try:
            for case in plan_cases(args):
                if case.model != loaded:
                    t0 = time.perf_counter()
                    engine, loaded = await load_model(admin, server, case.model), case.model
                    print(f"loaded {case.model} in {time.perf_counter() - t0:.1f} s (engine at {engine})")
                if case.peer and peer is None:
                    peer = gw_peers.LiteLLM(work / "litellm", model=case.model, engine_url=engine)
                    t0 = time.perf_counter()
                    await asyncio.to_thread(peer.wait_ready)
                    meters["litellm"] = peer.cpu_s
                    print(f"LiteLLM proxy at {peer.url} ready in {time.perf_counter() - t0:.1f} s")
                routes = make_routes(case, engine=engine, gateway=server.url, peer=peer)
                t0, lines0 = time.perf_counter(), server.engine_log_lines(case.model)
                sides = await run_case(sessions, routes, case, meters)
                results.append((case, sides))
                sent = sum(sd.sent for sd in sides.values())
                per_req = (server.engine_log_lines(case.model) - lines0) / sent
                print(
                    f"  {case.label} {case.surface} c={case.concurrency}: {time.perf_counter() - t0:.1f} s, "
                    f"{per_req:.0f} engine log lines per request read by the gateway"
                    f"{case_note(case, sides, slot_ctx, routes[1].body)}",
                    flush=True,
                )
        finally:
            if peer is not None:
                peer.stop()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Gateway overhead: streaming chat, direct vs through switchyard."
    )
    ap.add_argument("--quick", action="store_true", help="a short run: concurrency 1 and 8, few requests")
    ap.add_argument(
        "--requests", type=int, default=0, help="requests per side per case, at least 12 waves (default 96)"
    )
    ap.add_argument("--models", default="large,medium,tiny", help="models of the pass-through cases")
    ap.add_argument("--concurrency", default="", help="levels, e.g. 1,8 (default 1,8,32; --surfaces 1,8)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request, large model (default 32)")
    ap.add_argument("--medium-max-tokens", type=int, default=64, help="tokens per request, medium model")
    ap.add_argument("--tiny-max-tokens", type=int, default=64, help="tokens per request, tiny model")
    ap.add_argument("--parallel", type=int, default=32, help="engine slots (default 32: c=32 runs at once)")
    ap.add_argument("--threads", type=int, default=0, help="engine CPU threads (default 0: all cores)")
    ap.add_argument(
        "--small-slots",
        action="store_true",
        help=f"{SMALL_CTX_PER_SLOT}-token slots (default {CTX_PER_SLOT}): the gateway counts every prompt",
    )
    ap.add_argument(
        "--surfaces",
        action="store_true",
        help="instead of the pass-through grid: the Anthropic, Responses and Ollama routes (medium model)",
    )
    ap.add_argument("--peer", choices=["litellm"], help="add a peer proxy as a third side (large model)")
    ap.add_argument("--profile", action="store_true", help="profile serve; print top functions per event")
    ap.add_argument("--profile-tool", choices=["auto", "py-spy", "cprofile"], default="auto")
    ap.add_argument("--gateway-fresh", action="store_true", help="new connection per proxy request too")
    ap.add_argument("--server-log-level", default="warning", help="log level of switchyard serve")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny-model cases")
    return ap.parse_args(argv)


def start_profiler(args: argparse.Namespace, tmp: Path) -> tuple[str | None, Path | None]:
    """(py-spy binary, cProfile output path): at most one of them, both None without --profile."""
    if not args.profile:
        return None, None
    exe = gw_peers.py_spy() if args.profile_tool in ("auto", "py-spy") else None
    if exe is None and args.profile_tool == "py-spy":
        raise SystemExit("py-spy could not be installed; rerun with --profile-tool cprofile")
    if exe is None:
        print("profiling with cProfile (main thread; it slows the gateway, so its figures read high)")
        return None, tmp / "serve.prof"
    return exe, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    cpu = psutil.cpu_count(logical=True)
    slot_ctx = SMALL_CTX_PER_SLOT if args.small_slots else CTX_PER_SLOT
    spy: gw_peers.PySpy | None = None
    with tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        cases = plan_cases(args)
        write_models(models, {c.model for c in cases})
        spy_exe, cprof = start_profiler(args, Path(tmp))
        server = Server(
            Path(tmp) / "home",
            models,
            parallel=args.parallel,
            threads=args.threads,
            log_level=args.server_log_level,
            slot_ctx=slot_ctx,
            cprofile_to=cprof,
        )
        try:
            server.wait_ready()
            if spy_exe is not None:
                spy = gw_peers.PySpy(spy_exe, server.proc.pid, Path(tmp) / "py-spy.txt")
            print(
                f"switchyard serve at {server.url} (pid {server.proc.pid}, app from {app_origin()}); "
                f"{cpu} CPUs; engine slots {args.parallel} of {slot_ctx} tokens, threads "
                f"{args.threads or 'auto'}; code {code_version()}"
            )
            ticks0, own0 = cpu_ticks(), own_cpu_s() + server.cpu_s()
            results = asyncio.run(bench(args, server, slot_ctx=slot_ctx, work=Path(tmp)))
        except BaseException:
            print(
                f"--- switchyard serve stderr (tail) ---\n{server.log_path.read_text()[-3000:]}",
                file=sys.stderr,
            )
            raise
        finally:
            if spy is not None:
                spy.stop()  # before the server goes, so py-spy writes what it saw
            rc, left = server.stop()
            print(f"server stopped with SIGTERM (exit {rc}); engine processes left: {left or 'none'}")
        machine = describe_cpu(ticks0, cpu_ticks(), own_cpu_s() - own0)
        top: list[tuple[str, float]] = []
        if spy is not None:
            top = spy.top(15)
        elif cprof is not None and cprof.exists():
            top = gw_peers.cprofile_top(cprof, 15)
    print()
    print_table(results)
    print_verdicts(results)
    print(machine)
    if args.profile:
        events = sum(sides["gateway"].events_all for _, sides in results)
        gw_peers.print_profile(top, events=events, tool="py-spy" if spy else "cProfile")
    print(f"\ntotal run time {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
