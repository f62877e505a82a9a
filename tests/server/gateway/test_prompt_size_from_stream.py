"""An Anthropic stream's message_start reports the prompt's size without asking the engine to count it
(issue 35): llama.cpp tells it in the stream's first chunk (`return_progress`), so the render and tokenize
calls that came before every stream are gone, and the count is still the engine's own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import psutil

from tests.conftest import ServerProcess, link_models, running_server

HI = [{"role": "user", "content": "hi there"}]


def _to_engine(serve: psutil.Process, port: int) -> list[int]:
    """serve's established connections to the engine's port (its local ports)."""
    return [
        c.laddr.port
        for c in serve.net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]


def _engine_port(server: ServerProcess, model: str) -> int:
    lanes = httpx.get(server.url + "/api/lanes", timeout=30).json()["lanes"]
    return int(next(ln for ln in lanes if ln["model"] == model and ln["state"] == "ready")["port"])


def test_message_start_counts_the_prompt_with_no_call_besides_the_stream(
    tmp_path: Path, model_store: Path, large_model: Path
) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf", large_model)
    body = {"model": "large", "max_tokens": 48, "stream": True, "messages": HI, "ignore_eos": True}
    with running_server(tmp_path / "home", models) as server:
        counted = httpx.post(
            server.url + "/v1/messages/count_tokens", json={"model": "large", "messages": HI}, timeout=120
        ).json()["input_tokens"]
        port = _engine_port(server, "large")
        serve = psutil.Process(server.proc.pid)
        deadline = time.monotonic() + 20  # the count's kept connection closes once idle (0.25 s)
        while _to_engine(serve, port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _to_engine(serve, port) == [], "serve kept a connection to the idle engine"
        seen: list[list[int]] = []
        with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=120) as r:
            lines = r.iter_lines()
            start = json.loads(next(ln for ln in lines if ln.startswith("data: "))[6:])
            # a count made before message_start would leave its connection open for a while beside the
            # stream's own: look while the answer is still being generated (48 tokens of the large model)
            for _ in range(5):
                seen.append(_to_engine(serve, port))
                time.sleep(0.02)
            rest = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    assert start["type"] == "message_start", start
    assert start["message"]["usage"]["input_tokens"] == counted > 0, (start, counted)
    assert rest[-1]["type"] == "message_stop", rest[-3:]
    # message_delta: the engine's own count at the end
    assert rest[-2]["usage"]["input_tokens"] == counted, (rest[-2], counted)
    # the smallest of the looks: another short-lived connection of serve's own may cross one of them
    assert min(len(ports) for ports in seen) <= 1, f"serve held more than the stream's connection: {seen}"
