"""Load: 64 concurrent streaming clients for 60 s through the gateway to one lane.

Each client loops: open a stream, read it to its end, repeat. Most use /v1/chat/completions (bytes
passed through), every fourth /v1/responses (translated), and every eighth hangs up after a few
chunks, as an editor cancelling a completion does. Every stream must end cleanly (`[DONE]` or a final
response event) or with a clean error (an enveloped HTTP error or an error event), none may hang past
its timeout, the gateway's memory must stay flat, and the lane must end ready and idle.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.conftest import ServerProcess, link_models

CLIENTS = 64
DURATION_S = 60.0
REQUEST_TIMEOUT_S = 45.0  # queueing for a slot included: 64 clients share 8 slots
RSS_GROWTH_LIMIT = 30 * 1024 * 1024
MESSAGES = [{"role": "user", "content": "tell me a story"}]


@dataclass
class Tally:
    completed: collections.Counter[str] = field(default_factory=collections.Counter)
    clean_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    hung: int = 0
    unclean: list[str] = field(default_factory=list)
    cancelled: int = 0
    chunks: int = 0
    first_chunk_s: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))


def _request(i: int, n: int) -> tuple[str, dict[str, Any], Callable[[dict[str, Any]], bool]]:
    """(path, body, is_final_event) for client i's n-th request."""
    max_tokens = 24 + (i * 7 + n) % 48
    if i % 4 == 3:
        body = {"model": "tiny", "input": MESSAGES, "max_output_tokens": max_tokens, "stream": True}
        return "/v1/responses", body, lambda d: d.get("type") in ("response.completed", "response.incomplete")
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
    return "/v1/chat/completions", body, lambda d: False


async def _one(
    http: aiohttp.ClientSession, url: str, i: int, n: int, tally: Tally, *, hang_up_after: int | None
) -> None:
    path, body, is_final = _request(i, n)
    kind = path.rsplit("/", 1)[-1]
    t0 = time.monotonic()
    async with http.post(url + path, json=body) as r:
        if r.status != 200:
            err = (await r.json(content_type=None)).get("error", {})
            if (
                isinstance(err, dict)
                and isinstance(err.get("message"), str)
                and isinstance(err.get("code"), str)
            ):
                tally.clean_errors[f"{kind} HTTP {r.status} {err['code']}"] += 1
            else:
                tally.unclean.append(f"{kind} HTTP {r.status} without an error envelope")
            return
        seen, ended = 0, False
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                ended = True
                break
            data = json.loads(line[6:])
            if "error" in data or data.get("type") in ("error", "response.failed"):
                tally.clean_errors[f"{kind} error event"] += 1
                return
            seen += 1
            tally.chunks += 1
            if seen == 1:
                tally.first_chunk_s[kind].append(time.monotonic() - t0)
            if is_final(data):
                ended = True
                break
            if hang_up_after is not None and seen >= hang_up_after:
                tally.cancelled += 1
                return  # leaving the block closes the connection mid-stream
        if ended:
            tally.completed[kind] += 1
        else:
            tally.unclean.append(f"{kind} stream ended without its final event after {seen} chunks")


async def _client(url: str, i: int, deadline: float, tally: Tally) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        n = 0
        while time.monotonic() < deadline:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    await _one(http, url, i, n, tally, hang_up_after=3 if i % 8 == 7 and n % 2 == 0 else None)
            except TimeoutError:
                tally.hung += 1
            except (aiohttp.ClientError, ValueError) as exc:
                tally.unclean.append(f"{type(exc).__name__}: {exc}")
            n += 1


async def _run(server: ServerProcess) -> tuple[Tally, int, int]:
    tally = Tally()
    gateway = psutil.Process(server.proc.pid)
    deadline = time.monotonic() + DURATION_S
    clients = [asyncio.create_task(_client(server.url, i, deadline, tally)) for i in range(CLIENTS)]
    await asyncio.sleep(10)
    rss_10s = gateway.memory_info().rss
    await asyncio.gather(*clients)
    return tally, rss_10s, gateway.memory_info().rss


def _lane(server: ServerProcess) -> dict[str, Any]:
    async def get() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(server.url + "/api/lanes") as r:
            lanes = (await r.json())["lanes"]
        return {ln["id"]: ln for ln in lanes}["tiny"]

    return asyncio.run(get())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_64_streaming_clients_for_a_minute(start_server: Any, model_store: Path, tmp_path: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    server: ServerProcess = start_server(models, "--parallel", "8")
    asyncio.run(_warm(server))
    engine_pid = _lane(server)["pid"]

    tally, rss_10s, rss_end = asyncio.run(_run(server))

    done = sum(tally.completed.values())
    first = sorted(t for times in tally.first_chunk_s.values() for t in times)
    print(
        f"\nload: {CLIENTS} clients x {DURATION_S:.0f} s: {done} streams completed {dict(tally.completed)}, "
        f"{tally.cancelled} hung up by the client, clean errors {dict(tally.clean_errors)}, "
        f"{tally.hung} hung, {len(tally.unclean)} unclean; {tally.chunks} chunks; time to first chunk "
        f"p50 {first[len(first) // 2]:.2f} s p99 {first[int(len(first) * 0.99)]:.2f} s; gateway RSS "
        f"{rss_10s / 2**20:.1f} MiB at 10 s, {rss_end / 2**20:.1f} MiB at the end"
    )
    assert tally.hung == 0, "a stream outlived its timeout"
    assert not tally.unclean, tally.unclean[:10]
    # the engine never died (same pid, no restart, checked below), so a 502 engine_crashed would be a
    # false report: a pooled connection the engine had closed after a stream, handed out again
    assert not [k for k in tally.clean_errors if "engine_crashed" in k], tally.clean_errors
    assert tally.completed["completions"] > CLIENTS and tally.completed["responses"] > CLIENTS // 4
    assert rss_end - rss_10s < RSS_GROWTH_LIMIT, f"gateway RSS grew {(rss_end - rss_10s) / 2**20:.1f} MiB"

    lane: dict[str, Any] = {}
    deadline = time.monotonic() + 10  # a hung-up stream's bookkeeping may still be settling
    while time.monotonic() < deadline:
        lane = _lane(server)
        if lane["in_flight"] == 0:
            break
        time.sleep(0.1)
    assert lane["state"] == "ready" and lane["in_flight"] == 0 and lane["error"] is None
    assert lane["pid"] == engine_pid and lane["restarts"] == 0
    assert server.proc.poll() is None


async def _warm(server: ServerProcess) -> None:
    """Load the lane before the clock starts, so the minute measures serving, not loading."""
    async with aiohttp.ClientSession() as http:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
        async with http.post(server.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
