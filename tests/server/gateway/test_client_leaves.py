"""A client that leaves a non-streamed request (issue 33): the gateway holds no connection of that request
to the engine 0.3 s of its own time after the client left, and the engine's slot is freed soon after, on
every surface's non-streamed path.

A real `switchyard serve` with real llama.cpp lanes on generated models. Each path is left four times in
a row while the engine generates: the request is sent on a raw socket and closed, then the server's
connections to the engine's port (psutil, from the server's side) and the engine's /slots are watched.
A liveness check every second (engine_liveness_s) also talks to the engine, so a connection kept idle in
a pool after its request is seen too: it is what stayed open before the supervisor's session stopped
pooling (with llama.cpp's 5 s keep-alive, a pooled one outlived its client by seconds).

The gateway's own time is the wall time less the time the kernel kept the server's event-loop thread, and
this test's thread in the polls that saw the close, runnable but off every CPU (schedstat's run-queue
wait). On a shared 2-core machine under load 5 to 15 the server was kept waiting that way for up to 2.2 s
in about one leave in thirty; traced, it closed the connection within milliseconds of running again each
time. An await that missed the cancellation, a `finally` that waits, a pooled connection: each is time the
server sleeps with the connection open, which no run-queue wait excuses."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ServerProcess, link_models, wait_gone
from tests.support.tinymodels import MEDIUM, write_tiny_gguf

TRIALS = 4
# the client gone -> no connection of the gateway to the engine, in the gateway's own time (the module's
# docstring): 0.026 s at most in 240 leaves here, so this bound has room for a loaded machine
OWN_LIMIT_S = 0.3
# the wall-time bound where the kernel reports no run-queue wait (no schedstat): the issue's "still open
# two seconds after"
LIMIT_S = 2.0
# how long the close is watched: past the bounds, so a starved server's trial is still measured
WATCH_S = 10.0
# the slot is the engine's to free once it sees the connection closed: about 0.1 s in most trials, but up
# to 2.3 s was measured here under load 10-15 from other work, so this bound is the engine's with room
SLOT_LIMIT_S = 4.0
# the slot and the end of a trial are watched less often than the connection: each look at /slots is a
# task in the engine's queue, which on 2 cores slows the very slot it watches
SLOW_STEP_S = 0.05
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

    # the lane's first load runs a smoke test (app/lanes/smoke.py): its own request to the engine, which a
    # trial would see as an open connection, ended once its result is listed
    def smoked() -> bool:
        return any(m["id"] == model and m["smoke"] for m in _get(f"{server.url}/api/library")["models"])

    assert _until(smoked, 60, step=0.1) is not None, f"{model}: no smoke test result"
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


def _until(pred: Any, timeout: float, *, step: float = 0.01) -> float | None:
    """Seconds until `pred()` held (asked every `step` s), or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def _queued_s(pid: int, tid: int) -> float | None:
    """Seconds thread `tid` of process `pid` has been runnable but waiting for a CPU (the kernel's
    schedstat); None where the kernel does not say."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Leave:
    """One leave, in seconds from the client's close: until the gateway held no connection of its request
    to the engine (inf: not within WATCH_S); of that, how long the server's event loop waited for a CPU,
    and how long this test did in the polls that saw the close (None where the kernel does not say); until
    the engine's slot was free."""

    gone: float
    queued: float | None
    late: float | None
    free: float = 0.0

    @property
    def own(self) -> float | None:
        """The gateway's own part of `gone`: the time its event loop could have run and did not close."""
        if self.queued is None or self.late is None:
            return None
        return self.gone - self.queued - self.late

    def within(self) -> bool:
        own = self.own
        return own <= OWN_LIMIT_S if own is not None else self.gone <= LIMIT_S


def _close_seen(server: ServerProcess, port: int, sock: socket.socket, mine: set[int] | None) -> Leave:
    """Close the client's `sock` and watch until none of the connections `mine` (None: any) of the server
    to the engine is open."""

    def still_open() -> bool:
        now = set(_upstream(server, port))
        return bool(now if mine is None else mine & now)

    me = (os.getpid(), threading.get_native_id())
    loop_queued = _queued_s(server.proc.pid, server.proc.pid)  # the event loop runs on the main thread
    sock.close()
    t0 = time.monotonic()
    # this test's run-queue wait at the start of the last two polls: the close may have come just after
    # the earlier one read the connections
    marks = [_queued_s(*me)] * 2
    while still_open():
        if time.monotonic() - t0 > WATCH_S:
            return Leave(gone=math.inf, queued=None, late=None)
        time.sleep(0.01)
        marks = [marks[1], _queued_s(*me)]
    gone = time.monotonic() - t0
    now, seen = _queued_s(server.proc.pid, server.proc.pid), _queued_s(*me)
    queued = now - loop_queued if now is not None and loop_queued is not None else None
    late = seen - marks[0] if seen is not None and marks[0] is not None else None
    return Leave(gone=gone, queued=queued, late=late)


def _answered(sock: socket.socket) -> bool:
    """Whether the answer (or any byte of it) has come: the engine finished before the client left."""
    return bool(select.select([sock], [], [], 0)[0])


def _settled(server: ServerProcess, port: int) -> bool:
    return not _upstream(server, port) and not _busy(port)


def _leave(server: ServerProcess, port: int, path: str, body: dict[str, Any]) -> Leave | None:
    """Send, leave while the engine generates, and watch the gateway close; None if the answer ended
    first."""
    assert _until(lambda: _settled(server, port), 10, step=SLOW_STEP_S) is not None  # the last trial's end
    # the request's own connections are those opened after it was sent (not a probe of the supervisor's)
    before = set(_upstream(server, port))
    sock = _send(server, path, {"model": "medium", **body})
    began = _until(lambda: _answered(sock) or _busy(port), 30)
    assert began is not None, f"{path}: the engine never began"
    time.sleep(0.05)
    # one look at the connections: an answer that ends between two looks would leave none of them its own
    mine = set(_upstream(server, port)) - before
    if not (mine and _busy(port)) or _answered(sock):
        sock.close()
        return None
    left = time.monotonic()
    closed = _close_seen(server, port, sock, mine)
    # watched past the limit, so a failure says by how much
    _until(lambda: not _busy(port), 3 * SLOT_LIMIT_S, step=SLOW_STEP_S)
    return dataclasses.replace(closed, free=time.monotonic() - left)


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
    took: list[Leave] = []
    for _ in range(30):  # Ollama's answers end by chance (no ignore_eos): those trials are asked again
        if (one := _leave(server, port, path, body)) is not None:
            took.append(one)
        if len(took) == TRIALS:
            break
    assert len(took) == TRIALS, f"{name}: the engine's answers kept ending before the client left"
    # the gateway's part: its connection to the engine closed at once, every time
    assert all(t.within() for t in took), f"{name}: {took}"
    assert all(t.free <= SLOT_LIMIT_S for t in took), f"{name}: {took}"


def test_an_embedding_whose_client_left_keeps_no_connection(server: ServerProcess) -> None:
    port = _load(server, "embed")
    text = " ".join(f"w{i}" for i in range(100))
    for _ in range(TRIALS):
        assert (
            _until(lambda: _settled(server, port), 10, step=SLOW_STEP_S) is not None
        )  # the last trial's end
        sock = _send(server, "/v1/embeddings", {"model": "embed", "input": [text] * 4})
        time.sleep(0.02)
        closed = _close_seen(server, port, sock, None)
        assert closed.within(), (closed, _upstream(server, port))
        assert _until(lambda: not _busy(port), SLOT_LIMIT_S, step=SLOW_STEP_S) is not None
