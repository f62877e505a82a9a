"""A client that leaves a non-streamed request (issue 33): within two seconds (mostly 0.1 s) the gateway holds
no connection of that request to the engine, and the engine's slot is freed soon after, on every surface's
non-streamed path.

A real `switchyard serve` with real llama.cpp lanes on generated models. Each path is left three times in
a row while the engine generates: the request is sent on a raw socket and closed, then the server's
connections to the engine's port (psutil, from the server's side) and the engine's /slots are watched.
A liveness check every second (engine_liveness_s) also talks to the engine, so a connection kept idle in
a pool after its request is seen too: it is what stayed open before the supervisor's session stopped
pooling (with llama.cpp's 5 s keep-alive, a pooled one outlived its client by seconds)."""

from __future__ import annotations

import json
import math
import select
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ServerProcess, link_models, wait_gone
from tests.support.tinymodels import MEDIUM, write_tiny_gguf

TRIALS = 3
# the client gone -> no connection of the gateway to the engine. Issue 33's defect was "still open two
# seconds after"; most trials close it within 0.1 s, but about one in ten (every path, any load) kept it
# until the engine freed the slot, 1.0-1.6 s later: not yet explained, so the bound is the 2 s
LIMIT_S = 2.0
# the slot is the engine's to free once it sees the connection closed: about 0.1 s in most trials, but up
# to 2.3 s was measured here under load 10-15 from other work, so this bound is the engine's with room
SLOT_LIMIT_S = 4.0
GO = [{"role": "user", "content": "go on"}]
LONG = {"max_tokens": 3000, "ignore_eos": True}
# Ollama has no ignore_eos: random weights end its answer by chance, so a trial whose answer ended before
# the client left is asked again
OLLAMA = {"stream": False, "options": {"num_predict": 3000}}
PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": ("/v1/chat/completions", {"messages": GO, **LONG}),
    "openai-completions": ("/v1/completions", {"prompt": "go on", **LONG}),
    "anthropic": ("/v1/messages", {"messages": GO, **LONG}),
    "responses": ("/v1/responses", {"input": "go on", "max_output_tokens": 3000, "ignore_eos": True}),
    "ollama-chat": ("/api/chat", {"messages": GO, **OLLAMA}),
    "ollama-generate": ("/api/generate", {"prompt": "go on", **OLLAMA}),
}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _load(server: ServerProcess, model: str) -> int:
    req = urllib.request.Request(
        f"{server.url}/api/models/{model}/load", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
    return int(_get(f"{server.url}/api/lanes/{model}")["port"])


def _busy(port: int) -> bool:
    return any(slot["is_processing"] for slot in _get(f"http://127.0.0.1:{port}/slots"))


def _upstream(server: ServerProcess, port: int) -> list[int]:
    """The local ports of the server's open connections to the engine on `port`."""
    return [
        c.laddr.port
        for c in psutil.Process(server.proc.pid).net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]


def _send(server: ServerProcess, path: str, body: dict[str, Any]) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _until(pred: Any, timeout: float) -> float | None:
    """Seconds until `pred()` held, or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def _answered(sock: socket.socket) -> bool:
    """Whether the answer (or any byte of it) has come: the engine finished before the client left."""
    return bool(select.select([sock], [], [], 0)[0])


def _settled(server: ServerProcess, port: int) -> bool:
    return not _upstream(server, port) and not _busy(port)


def _leave(server: ServerProcess, port: int, path: str, body: dict[str, Any]) -> tuple[float, float] | None:
    """Send, leave while the engine generates; (seconds until the gateway held no connection to the
    engine, until its slot was free), inf where not within the limits; None if the answer ended first."""
    assert _until(lambda: _settled(server, port), 10) is not None  # the previous trial's end
    # the request's own connections are those opened after it was sent (not a probe of the supervisor's)
    before = set(_upstream(server, port))
    sock = _send(server, path, {"model": "medium", **body})
    began = _until(lambda: _answered(sock) or _busy(port), 30)
    assert began is not None, f"{path}: the engine never began"
    time.sleep(0.05)
    if _answered(sock) or not (_upstream(server, port) and _busy(port)):
        sock.close()
        return None
    mine = set(_upstream(server, port)) - before
    sock.close()
    left = time.monotonic()
    gone = _until(lambda: not mine & set(_upstream(server, port)), LIMIT_S)
    # watched past the limit, so a failure says by how much
    _until(lambda: not _busy(port), 3 * SLOT_LIMIT_S)
    free = time.monotonic() - left
    return (gone if gone is not None else math.inf, free)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("leaves")
    models = link_models(base / "models", model_store / "embed.gguf")
    write_tiny_gguf(models / "medium.gguf", MEDIUM)
    home = base / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"engine_liveness_s": 1.0, "max_loaded_lanes": 2}))
    s = ServerProcess(home, models).wait_ready()
    yield s
    pids = s.engine_pids()
    s.stop()
    assert not wait_gone(pids, 5)


@pytest.mark.parametrize("name", list(PATHS))
def test_a_client_that_leaves_frees_the_engine_within_a_second(server: ServerProcess, name: str) -> None:
    port = _load(server, "medium")
    path, body = PATHS[name]
    took: list[tuple[float, float]] = []
    for _ in range(30):  # Ollama's answers end by chance (no ignore_eos): those trials are asked again
        if (one := _leave(server, port, path, body)) is not None:
            took.append(one)
        if len(took) == TRIALS:
            break
    assert len(took) == TRIALS, f"{name}: the engine's answers kept ending before the client left"
    # the gateway's part: its connection to the engine closed at once, every time
    assert all(gone <= LIMIT_S for gone, _ in took), f"{name}: (connection gone, slot free) s: {took}"
    assert all(free <= SLOT_LIMIT_S for _, free in took), f"{name}: (connection gone, slot free) s: {took}"


def test_an_embedding_whose_client_left_keeps_no_connection(server: ServerProcess) -> None:
    port = _load(server, "embed")
    text = " ".join(f"w{i}" for i in range(100))
    for _ in range(TRIALS):
        sock = _send(server, "/v1/embeddings", {"model": "embed", "input": [text] * 4})
        time.sleep(0.02)
        sock.close()
        assert _until(lambda: not _upstream(server, port), LIMIT_S) is not None, _upstream(server, port)
        assert _until(lambda: not _busy(port), SLOT_LIMIT_S) is not None
