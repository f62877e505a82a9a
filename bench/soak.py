"""Soak: 64 streams for 10 minutes against a real `switchyard serve`, with faults injected.

Every worker loops over a mix of requests (OpenAI streamed and not, Anthropic streamed, two models so the
lane swaps) and plays a client kind chosen per request: a normal one, one that hangs up mid-stream, or a slow
reader. Mixed in: chat requests with images to a vision model with a real projector (a small PNG, which
its encoder reads, and a decompression bomb, refused from its header before anything is decoded),
Realtime transcription sessions (a few seconds of audio per append through voice detection, then
cleared) and eval runs (a one-case suite, from the server's suites folder, through its own gateway). A
fault task SIGKILLs the running engine every `--kill-every` seconds, and a watcher times `/health` twice a
second (a pause over a second is a failure). Each request ends in one of:

    ok        the answer came whole (a streamed one ends with its final event)
    refused   a clean error: an error envelope with a code, or an in-stream error event
    dropped   we hung up on purpose
    FAILED    anything else: a 500 internal_error, a stream cut without an error, no answer in 120 s

At the end the server is stopped with SIGTERM and no process of its tree may remain. The serve process's
RSS is sampled each second; its median over the first minute after warm-up is compared with the median over
the last minute (flat memory: a ratio near 1.0).

    .venv/bin/python bench/soak.py                 # the full soak: 64 streams, 10 minutes
    .venv/bin/python bench/soak.py --minutes 1     # a short run

Exits 1 when a request FAILED or a process outlived the server: the soak is a check of behaviour under
load, its figures (RSS, request counts) go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import Server

REPO = Path(__file__).resolve().parent.parent
MODELS = ("soak-a", "soak-b")
VISION = "vision/soak-v"  # with a real projector beside it, so images go through the engine's encoder
REQUEST_DEADLINE_S = 120.0
HEALTH_STALL_S = 1.0


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    kills: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)
    kinds: Counter[str] = field(default_factory=Counter)
    health_worst: float = 0.0
    image_answers: int = 0  # image requests answered 200: decoded and encoded by the vision model's projector

    def fail(self, why: str) -> None:
        self.outcomes["FAILED"] += 1
        if len(self.failures) < 20:
            self.failures.append(why)


def write_models(models_dir: Path) -> None:
    sys.path.insert(0, str(REPO))
    from tests.support import tinymodels, visiongen

    for i, name in enumerate(MODELS):
        spec = tinymodels.CHAT if i == 0 else tinymodels.MEDIUM
        tinymodels.write_tiny_gguf(models_dir / f"{name}.gguf", spec)
    # a vision model: its projector (beside it, the width of CHAT's embedding) encodes the images it is sent
    tinymodels.write_tiny_gguf(models_dir / f"{VISION}.gguf", tinymodels.CHAT)
    visiongen.write_tiny_mmproj(models_dir / "vision" / "mmproj-soak-v-f32.gguf")


def _body(kind: str, model: str, *, stream: bool) -> tuple[str, dict[str, object]]:
    tokens = random.choice((8, 24, 48))
    if kind == "anthropic":
        return "/v1/messages", {
            "model": model,
            "max_tokens": tokens,
            "stream": stream,
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
        }
    return "/v1/chat/completions", {
        "model": model,
        "max_tokens": tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
    }


def _png(width: int, height: int, idat: bytes) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _images() -> tuple[str, str]:
    """(a small real PNG, a bomb declaring 16384x16384 in a few KB) as data: URLs."""
    import base64
    import zlib

    small = _png(16, 16, zlib.compress(b"".join(b"\0" + b"\x80" * 48 for _ in range(16))))
    bomb = _png(16384, 16384, zlib.compress(b"\0" * 65536))
    small_url, bomb_url = (f"data:image/png;base64,{base64.b64encode(b).decode()}" for b in (small, bomb))
    return small_url, bomb_url


IMAGES = _images()
SUITE_NAME = "soak-suite.yaml"


async def refused_or_failed(t: Tally, r: aiohttp.ClientResponse, what: str) -> None:
    payload = await r.read()
    code = _error_code(payload)
    # the same rule as chat's: a 503 engine_start_failed (a kill landing in a start) is a clean refusal
    if (r.status == 500 and code in (None, "internal_error")) or code is None:
        t.fail(f"HTTP {r.status} on {what}: {payload[:200]!r}")
    else:
        t.outcomes["refused"] += 1
        t.codes[code] += 1


async def one_image(http: aiohttp.ClientSession, url: str, t: Tally) -> None:
    image = random.choice(IMAGES)
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image}}]
    body = {
        "model": VISION,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": content}],
    }
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        if r.status >= 400:
            await refused_or_failed(t, r, "an image request")
        else:
            t.outcomes["ok"] += 1
            t.image_answers += 1


async def one_realtime(http: aiohttp.ClientSession, url: str, t: Tally) -> None:
    import base64

    noise = os.urandom(24000 * 2 * random.choice((1, 3)))  # 1 or 3 s of 24 kHz PCM16
    async with http.ws_connect(url + "/v1/realtime?intent=transcription") as ws:
        first = await ws.receive_json()
        if first.get("type") != "session.created":
            t.fail(f"realtime: {str(first)[:200]}")
            return
        await ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(noise).decode()})
        await ws.send_json({"type": "input_audio_buffer.clear"})
        while True:
            event = await ws.receive_json()
            if event.get("type") == "input_audio_buffer.cleared":
                t.outcomes["ok"] += 1
                return
            if event.get("type") == "error":
                t.outcomes["refused"] += 1
                t.codes[str(event["error"].get("code"))] += 1
                return


async def one_eval(http: aiohttp.ClientSession, url: str, t: Tally, suite: Path) -> None:
    # by name: the server reads suites only from its suites folder
    async with http.post(url + "/api/evals", json={"model": MODELS[0], "suite": suite.name}) as r:
        if r.status >= 400:
            await refused_or_failed(t, r, "an eval run")
            return
        doc = await r.json()
        if "score" in doc:
            t.outcomes["ok"] += 1
        else:
            t.fail(f"eval answered 200 without a score: {str(doc)[:200]}")


async def health_watch(http: aiohttp.ClientSession, url: str, t: Tally, until: float) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            async with http.get(url + "/health") as r:
                await r.read()
                ok = r.status == 200
        except aiohttp.ClientError as exc:
            t.fail(f"/health: {type(exc).__name__}: {exc}")
            ok = True
        took = time.monotonic() - started
        t.health_worst = max(t.health_worst, took)
        if not ok:
            t.fail(f"/health answered HTTP {r.status}")
        if took > HEALTH_STALL_S:
            t.fail(f"/health took {took:.2f} s")
        await asyncio.sleep(0.5)


def _error_code(payload: bytes) -> str | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("code") or err.get("type") or "") or None
    return None


def _stream_event_error(line: bytes) -> str | None:
    """An in-stream error in OpenAI's (`data: {"error": ...}`) or Anthropic's (`event: error`) shape."""
    if line.startswith(b"data: ") and b'"error"' in line:
        return _error_code(line[6:]) or "stream_error"
    return None


async def one(http: aiohttp.ClientSession, url: str, t: Tally, *, client: str) -> None:
    surface = random.choice(("openai", "openai", "anthropic"))
    stream = client != "normal" or random.random() < 0.7
    path, body = _body(surface, random.choice(MODELS), stream=stream)
    async with http.post(url + path, json=body) as r:
        if r.status >= 400:
            payload = await r.read()
            code = _error_code(payload)
            if r.status == 500 and code in (None, "internal_error"):
                t.fail(f"HTTP 500 on {path}: {payload[:200]!r}")
            elif code is None:
                t.fail(f"HTTP {r.status} without an error envelope on {path}: {payload[:200]!r}")
            else:
                t.outcomes["refused"] += 1
                t.codes[code] += 1
            return
        if not stream:
            doc = await r.json()
            if "choices" in doc or "content" in doc:
                t.outcomes["ok"] += 1
            else:
                t.fail(f"200 without an answer on {path}: {str(doc)[:200]}")
            return
        lines = 0
        finished = False
        async for raw in r.content:
            line = raw.strip()
            code = _stream_event_error(line) or ("stream_error" if line == b"event: error" else None)
            if code:
                t.outcomes["refused"] += 1
                t.codes[code] += 1
                return
            if line in (b"data: [DONE]", b"event: message_stop"):
                finished = True
            lines += 1
            if client == "dropper" and lines >= random.randint(2, 6):
                t.outcomes["dropped"] += 1
                return  # leaving the block closes the connection mid-stream
            if client == "slow":
                await asyncio.sleep(0.2)
        if finished:
            t.outcomes["ok"] += 1
        else:
            t.fail(f"stream on {path} ended after {lines} lines without a final or an error event")


async def worker(http: aiohttp.ClientSession, url: str, t: Tally, until: float, suite: Path) -> None:
    while time.monotonic() < until:
        client = random.choices(("normal", "dropper", "slow"), weights=(7, 2, 1))[0]
        kind = random.choices(("chat", "image", "realtime", "eval"), weights=(80, 8, 7, 5))[0]
        t.kinds[kind] += 1
        try:
            async with asyncio.timeout(REQUEST_DEADLINE_S):
                if kind == "image":
                    await one_image(http, url, t)
                elif kind == "realtime":
                    await one_realtime(http, url, t)
                elif kind == "eval":
                    await one_eval(http, url, t, suite)
                else:
                    await one(http, url, t, client=client)
        except TimeoutError:
            t.fail(f"no answer in {REQUEST_DEADLINE_S:.0f} s")
        except aiohttp.ClientError as exc:
            t.fail(f"{type(exc).__name__}: {exc}")


async def killer(http: aiohttp.ClientSession, server: Server, t: Tally, until: float, every: float) -> None:
    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        async with http.get(server.url + "/api/lanes") as r:
            lanes = (await r.json())["lanes"]
        pids = [int(ln["pid"]) for ln in lanes if ln.get("pid")]
        if pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(random.choice(pids), signal.SIGKILL)
                t.kills += 1


async def sampler(server: Server, t: Tally, until: float) -> None:
    start = time.monotonic()
    while time.monotonic() < until:
        with contextlib.suppress(psutil.Error):
            t.rss.append((time.monotonic() - start, server.ps.memory_info().rss))
            for child in server.ps.children(recursive=True):
                t.seen_pids.add(child.pid)
        await asyncio.sleep(1.0)


def survivors(pids: set[int]) -> list[str]:
    left = []
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(p.cmdline())[:100]}")
    return left


async def soak(args: argparse.Namespace, server: Server, suite: Path) -> Tally:
    t = Tally()
    url = server.url
    timeout = aiohttp.ClientTimeout(total=None, sock_read=REQUEST_DEADLINE_S)
    conn = aiohttp.TCPConnector(limit=args.streams * 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
        until = time.monotonic() + args.minutes * 60
        tasks = [asyncio.create_task(worker(http, url, t, until, suite)) for _ in range(args.streams)]
        tasks.append(asyncio.create_task(sampler(server, t, until)))
        tasks.append(asyncio.create_task(health_watch(http, url, t, until)))
        if args.kill_every > 0:
            tasks.append(asyncio.create_task(killer(http, server, t, until, args.kill_every)))
        await asyncio.gather(*tasks)
    return t


def rss_report(t: Tally) -> tuple[float, float, float]:
    warm = [r for s, r in t.rss if 30 <= s < 90] or [r for _, r in t.rss[: len(t.rss) // 3]]
    last = [r for s, r in t.rss if s >= t.rss[-1][0] - 60] if t.rss else []
    a = statistics.median(warm) / 2**20 if warm else float("nan")
    b = statistics.median(last) / 2**20 if last else float("nan")
    return a, b, b / a if a else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between engine kills (0: none)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        models = work / "models"
        models.mkdir()
        write_models(models)
        # one case the tiny model answers exactly, through a grammar, in the server's suites folder
        suite = work / "home" / "suites" / SUITE_NAME
        suite.parent.mkdir(parents=True)
        case = {"id": "sum", "prompt": "17+25?", "expect": {"number": 42}}
        case["params"] = {"grammar": 'root ::= "42"', "max_tokens": 4}
        suite.write_text(json.dumps({"name": "soak", "cases": [case]}))
        server = Server(work / "home", models, parallel=4, threads=1, log_level="warning", slot_ctx=1024)
        server.wait_ready()
        t0 = time.monotonic()
        try:
            t = asyncio.run(soak(args, server, suite))
        finally:
            code, _ = server.stop()
        time.sleep(2)
        left = survivors(t.seen_pids | {server.proc.pid})
    total = sum(t.outcomes.values())
    a, b, ratio = rss_report(t)
    print(f"soak: {args.streams} streams, {(time.monotonic() - t0) / 60:.1f} min, {t.kills} engine kills")
    print(f"requests: {total}  " + "  ".join(f"{k}={v}" for k, v in sorted(t.outcomes.items())))
    print("traffic: " + ", ".join(f"{k}={v}" for k, v in t.kinds.most_common()))
    print(f"image requests answered through the projector: {t.image_answers}")
    print("refusal codes: " + ", ".join(f"{k}={v}" for k, v in t.codes.most_common()))
    print(f"/health: slowest answer {t.health_worst * 1000:.0f} ms")
    print(f"serve RSS: {a:.1f} MiB after warm-up, {b:.1f} MiB in the last minute (ratio {ratio:.2f})")
    print(f"serve exit code {code}; processes left after stop: {len(left)}")
    for line in left:
        print("  left:", line)
    for why in t.failures:
        print("  FAILED:", why)
    return 1 if t.outcomes["FAILED"] or left else 0


if __name__ == "__main__":
    sys.exit(main())
