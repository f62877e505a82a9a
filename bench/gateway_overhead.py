"""What the gateway costs a streaming chat completion: the same request, direct to the engine and through it.

One run generates its models, starts a real `switchyard serve`, loads a model, reads the engine's own port
from GET /api/lanes, and sends identical streaming chat completions (``ignore_eos`` and a fixed
``max_tokens``, so every request generates the same number of tokens) to the engine and to the gateway,
interleaved: request by request at concurrency 1, wave by wave (c requests at once) above it, with the side
that goes first alternating, so machine noise lands on both sides alike. Wave 0 of each side is a warm-up.

Measured on the client, per request: time to first token (the first SSE event with content) and the gaps
between content events; per side: aggregate completion tokens per second (tokens / summed wave wall time).
The gateway process's CPU time is sampled around every wave too: on the direct side it is what the gateway
spends while not in the path (supervising, reading engine logs), on the gateway side that plus proxying.

    .venv/bin/python bench/gateway_overhead.py            # full run (about 2 minutes on 2 cores)
    .venv/bin/python bench/gateway_overhead.py --quick    # a short smoke run

Both ratios are printed pooled (over all waves of a side) and paired (per round, from its two adjacent
waves, then the median over rounds); the paired figures shrug off bursts of foreign load and carry the
verdict. Targets, judged on the LARGE model (realistic token timing) at every concurrency: throughput
gateway/direct >= 0.98 and at most 1 ms added p50 TTFT. The tiny model shows the pure per-event overhead
and is reported, not judged. Exits 0 whatever the verdict: this is a benchmark, not a test.
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
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

REPO = Path(__file__).resolve().parent.parent
SIDES = ("direct", "gateway")
TARGET_RATIO = 0.98
TARGET_TTFT_MS = 1.0
CTX_PER_SLOT = 256  # prompt (~40 tokens with the template) + max_tokens fits with room to spare
PROMPT = "Write a long story about a lighthouse keeper and the sea."


# ---- measurement records ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    ttft_s: float
    gaps_s: tuple[float, ...]
    tokens: int
    events: int


@dataclass
class Side:
    """Everything measured on one path (direct or gateway) for one case."""

    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0
    server_cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # warm-up included
    sent: int = 0  # warm-up included
    rounds: dict[int, tuple[float, float]] = field(default_factory=dict)  # round -> (tok/s, TTFT p50 s)

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
    judged: bool


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
        return out.stdout.strip() or "unknown"
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
    ratios = [g.rounds[r][0] / d.rounds[r][0] for r in both]
    added = [1000 * (g.rounds[r][1] - d.rounds[r][1]) for r in both]
    return pct(ratios, 0.5), pct(added, 0.5)


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

    def __init__(self, home: Path, models_dir: Path, *, parallel: int, threads: int, log_level: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHONUNBUFFERED="1")
        argv = [
            sys.executable, "-m", "app", "serve", "--port", "0", "--models-dir", str(models_dir),
            "--parallel", str(parallel), "--ctx-size", str(parallel * CTX_PER_SLOT), "--log-level", log_level,
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
        try:
            total = 0
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                with contextlib.suppress(FileNotFoundError):  # a thread may end while we read
                    total += int((task / "schedstat").read_text().split()[0])
            return total / 1e9
        except (OSError, ValueError, IndexError):
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


def request_body(model: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()


async def one_request(http: aiohttp.ClientSession, url: str, body: bytes) -> Sample:
    """One streaming chat completion, read to the end; timestamps every `data:` event with content."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RequestFailed(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        # read to EOF (not just [DONE]) so a keep-alive connection can be reused
        async for line in resp.content:
            now = time.perf_counter()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            # byte tests keep client CPU low; only the usage event is parsed
            if b'"content":"' in payload and b'"content":""' not in payload:
                stamps.append(now)
            elif b'"usage"' in payload:
                tokens = int((json.loads(payload).get("usage") or {}).get("completion_tokens") or 0)
            elif b'"error"' in payload:
                raise RequestFailed(f"{url}: error event: {payload[:300]!r}")
    if not stamps:
        raise RequestFailed(f"{url}: the stream carried no content")
    gaps = tuple(b - a for a, b in itertools.pairwise(stamps))
    return Sample(ttft_s=stamps[0] - t0, gaps_s=gaps, tokens=tokens or len(stamps), events=len(stamps))


async def attempt(http: aiohttp.ClientSession, url: str, body: bytes) -> Sample | str:
    try:
        return await one_request(http, url, body)
    except (RequestFailed, aiohttp.ClientError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def wave(
    http: aiohttp.ClientSession, url: str, body: bytes, *, n: int, server: Server, side: Side, rnd: int
) -> None:
    """`n` requests at once; timed into `side` unless it is round 0 (warm-up) or a request failed."""
    cpu0 = server.cpu_s()
    t0 = time.perf_counter()
    done = await asyncio.gather(*(attempt(http, url, body) for _ in range(n)))
    wall = time.perf_counter() - t0
    cpu = server.cpu_s() - cpu0
    failed = [x for x in done if isinstance(x, str)]
    side.errors.extend(failed)
    side.sent += n
    if rnd > 0 and not failed:  # a failed request would skew the wave's timing; it is counted instead
        samples = [x for x in done if isinstance(x, Sample)]
        tokens = sum(s.tokens for s in samples)
        side.samples.extend(samples)
        side.wall_s += wall
        side.tokens += tokens
        side.server_cpu_s += cpu
        side.rounds[rnd] = (tokens / wall, pct([s.ttft_s for s in samples], 0.5))


async def run_case(
    sessions: dict[str, aiohttp.ClientSession], urls: dict[str, str], case: Case, server: Server
) -> dict[str, Side]:
    body = request_body(case.model, case.max_tokens)
    sides = {name: Side() for name in SIDES}
    waves = max(2, math.ceil(case.requests / case.concurrency))
    for i in range(waves + 1):
        for name in SIDES if i % 2 == 0 else SIDES[::-1]:
            await wave(
                sessions[name], urls[name], body, n=case.concurrency, server=server, side=sides[name], rnd=i
            )
    return sides


# ---- report ----------------------------------------------------------------------------------------
def print_table(results: list[Result]) -> None:
    head = (
        f"{'model':<7}{'conc':>5}  {'path':<8}{'req':>5}{'TTFT p50':>10}{'TTFT p95':>10}"
        f"{'gap p50':>9}{'gap p95':>9}{'tok/s':>9}{'srv CPU/ev':>12}{'err':>5}"
    )
    print(head)
    print("-" * len(head))
    for case, sides in results:
        for name, s in sides.items():
            print(
                f"{case.label:<7}{case.concurrency:>5}  {name:<8}{len(s.samples):>5}"
                f"{s.ttft_ms(0.5):>10.2f}{s.ttft_ms(0.95):>10.2f}{s.gap_ms(0.5):>9.2f}{s.gap_ms(0.95):>9.2f}"
                f"{s.tok_s:>9.1f}{s.cpu_us_per_event():>9.0f} us{len(s.errors):>5}"
            )
    print(
        "times in ms; tok/s = completion tokens / summed wave wall time; 'srv CPU/ev' = CPU time of the\n"
        "switchyard serve process per streamed event while that side ran (direct: it is not in the path);\n"
        "err = requests that failed (warm-up included); a wave with a failure is left out of all timings\n"
    )


def judge(ratio: float, added_ms: float) -> str:
    tput = "PASS" if ratio >= TARGET_RATIO else "MISS"
    ttft = "PASS" if added_ms <= TARGET_TTFT_MS else "MISS"
    return f"throughput {tput}, TTFT {ttft}"


def print_verdicts(results: list[Result]) -> None:
    print(
        f"{'model':<7}{'conc':>5}{'tok/s gw/dir':>13}{'+TTFT p50':>11}{'+gap p50':>10}{'+srv CPU/ev':>13}"
        f"{'paired ratio':>14}{'paired +TTFT':>14}  verdict"
    )
    misses = 0
    for case, sides in results:
        d, g = sides["direct"], sides["gateway"]
        ratio = g.tok_s / d.tok_s
        added = g.ttft_ms(0.5) - d.ttft_ms(0.5)
        p_ratio, p_added = paired(d, g)
        gap, cpu = g.gap_ms(0.5) - d.gap_ms(0.5), g.cpu_us_per_event() - d.cpu_us_per_event()
        if case.judged:
            verdict = f"paired {judge(p_ratio, p_added)}; pooled {judge(ratio, added)}"
            misses += judge(p_ratio, p_added).count("MISS")
        else:
            verdict = "(overhead only, not judged)"
        if abs(ratio - p_ratio) > 0.05:
            verdict += "; noisy (pooled and paired ratios disagree)"
        print(
            f"{case.label:<7}{case.concurrency:>5}{ratio:>13.3f}{added:>8.2f} ms{gap:>7.2f} ms{cpu:>10.0f} us"
            f"{p_ratio:>14.3f}{p_added:>11.2f} ms  {verdict}"
        )
    errors: dict[str, int] = {}
    for case, sides in results:
        for name, side in sides.items():
            for e in side.errors:
                key = f"{case.label} {name}: {e}"
                errors[key] = errors.get(key, 0) + 1
    for msg, count in errors.items():
        print(f"FAILED x{count}  {msg}")
    print(
        f"\ntargets (large model): throughput gateway/direct >= {TARGET_RATIO}, "
        f"added TTFT p50 <= {TARGET_TTFT_MS:g} ms; paired: {'all PASS' if not misses else f'{misses} MISS'}\n"
        "pooled = over all recorded waves of a side; paired (the headline) = median over rounds of the\n"
        "same figure from the two adjacent waves of one round, which machine-noise bursts move far less"
    )


# ---- main ------------------------------------------------------------------------------------------
def plan_cases(args: argparse.Namespace) -> list[Case]:
    levels = (1, 8) if args.quick else (1, 8, 32)
    n = args.requests or (8 if args.quick else 96)
    waves = 2 if args.quick else 12  # the fewest waves per side
    cases = [Case("large", "large", args.max_tokens, c, max(n, waves * c), True) for c in levels]
    if not args.no_tiny:
        cases += [Case("tiny", "tiny", args.tiny_max_tokens, c, max(n, waves * c), False) for c in levels]
    return cases


def write_models(models_dir: Path, *, tiny: bool) -> None:
    sys.path.insert(0, str(REPO))
    from tests.tinymodels import CHAT, LARGE, write_tiny_gguf

    write_tiny_gguf(models_dir / "large.gguf", LARGE)
    if tiny:
        write_tiny_gguf(models_dir / "tiny.gguf", CHAT)


async def bench(args: argparse.Namespace, server: Server) -> list[Result]:
    timeout = aiohttp.ClientTimeout(total=600)
    # llama.cpp closes the connection after every streamed response, so the direct side needs a fresh one
    # each time (reusing a pooled one races with that close); the gateway keeps them alive like any client
    fresh = aiohttp.TCPConnector(limit=0, force_close=True)
    pooled = aiohttp.TCPConnector(limit=0, force_close=args.gateway_fresh)
    results: list[Result] = []
    async with (
        aiohttp.ClientSession(timeout=timeout) as admin,
        aiohttp.ClientSession(connector=fresh, timeout=timeout) as direct,
        aiohttp.ClientSession(connector=pooled, timeout=timeout) as gateway,
    ):
        engine, loaded = "", ""
        for case in plan_cases(args):
            if case.model != loaded:
                t0 = time.perf_counter()
                engine, loaded = await load_model(admin, server, case.model), case.model
                print(f"loaded {case.model} in {time.perf_counter() - t0:.1f} s (engine at {engine})")
            urls = {"direct": engine + "/v1/chat/completions", "gateway": server.url + "/v1/chat/completions"}
            t0, lines0 = time.perf_counter(), server.engine_log_lines(case.model)
            sides = await run_case({"direct": direct, "gateway": gateway}, urls, case, server)
            results.append((case, sides))
            short = [n for n, s in sides.items() if any(x.tokens != case.max_tokens for x in s.samples)]
            note = f"; WARNING: token count != max_tokens on {short}" if short else ""
            per_req = (server.engine_log_lines(case.model) - lines0) / sum(sd.sent for sd in sides.values())
            print(
                f"  {case.label} c={case.concurrency}: {time.perf_counter() - t0:.1f} s, "
                f"{per_req:.0f} engine log lines per request read by the gateway{note}",
                flush=True,
            )
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Gateway overhead: streaming chat, direct vs through switchyard."
    )
    ap.add_argument("--quick", action="store_true", help="a short run: concurrency 1 and 8, few requests")
    ap.add_argument(
        "--requests", type=int, default=0, help="requests per side per case, at least 12 waves (default 96)"
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request, large model (default 32)")
    ap.add_argument("--tiny-max-tokens", type=int, default=64, help="tokens per request, tiny model")
    ap.add_argument("--parallel", type=int, default=32, help="engine slots (default 32: c=32 runs at once)")
    ap.add_argument("--threads", type=int, default=0, help="engine CPU threads (default 0: all cores)")
    ap.add_argument("--gateway-fresh", action="store_true", help="new connection per gateway request too")
    ap.add_argument("--server-log-level", default="warning", help="log level of switchyard serve")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny-model pure-overhead cases")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    cpu = psutil.cpu_count(logical=True)
    with tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        write_models(models, tiny=not args.no_tiny)
        server = Server(
            Path(tmp) / "home",
            models,
            parallel=args.parallel,
            threads=args.threads,
            log_level=args.server_log_level,
        )
        try:
            server.wait_ready()
            print(
                f"switchyard serve at {server.url} (pid {server.proc.pid}); {cpu} CPUs; engine slots "
                f"{args.parallel}, threads {args.threads or 'auto'}; max_tokens large {args.max_tokens}, "
                f"tiny {args.tiny_max_tokens}; code {code_version()}"
            )
            ticks0, own0 = cpu_ticks(), own_cpu_s() + server.cpu_s()
            results = asyncio.run(bench(args, server))
        except BaseException:
            print(
                f"--- switchyard serve stderr (tail) ---\n{server.log_path.read_text()[-3000:]}",
                file=sys.stderr,
            )
            raise
        finally:
            rc, left = server.stop()
            print(f"server stopped with SIGTERM (exit {rc}); engine processes left: {left or 'none'}")
        machine = describe_cpu(ticks0, cpu_ticks(), own_cpu_s() - own0)
    print()
    print_table(results)
    print_verdicts(results)
    print(machine)
    print(f"\ntotal run time {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
