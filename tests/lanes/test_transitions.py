"""Lane transitions as the headless server logs them, readiness taken from the engine's own line, the
engine's log verbosity while serving, and the bulk log reader."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from app.core.paths import Paths
from app.core.settings import Settings
from app.formats.gguf_layout import read_gguf_layout
from app.lanes.lane import LaneState
from app.lanes.proc import EngineProcess, LogRing
from app.runtime import Runtime
from tests.conftest import link_models
from tests.support.tinymodels import TinySpec, write_tiny_gguf


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def _post(url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _lane_lines(stderr: str, model: str) -> list[str]:
    """The transition lines of one lane in the server's log (message part only)."""
    pat = re.compile(rf" INFO switchyard\.lanes: lane {re.escape(model)} \(llama\.cpp\): (.*)$")
    return [m[1] for m in map(pat.search, stderr.splitlines()) if m]


def _wait_lines(server: Any, model: str, count: int, within: float = 20) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = _lane_lines(server.stderr_text(), model)
        if len(got) >= count:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{model}: {_lane_lines(server.stderr_text(), model)}")


def test_serve_logs_one_line_per_transition(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    models = link_models(
        tmp_path / "models", *(model_store / n for n in ("tiny.gguf", "tiny2.gguf", "embed.gguf"))
    )
    home = tmp_path / "home0"  # the home start_server gives its first server
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"model_overrides": {"embed": {"ttl_s": 1}}}))
    s = start_server(models, "--max-loaded", "1")

    _post(s.url + "/api/models/tiny/load")
    tiny = _wait_lines(s, "tiny", 2)
    assert tiny[0] == "starting" and re.fullmatch(r"ready in \d+\.\d\d s", tiny[1]), tiny

    _post(s.url + "/api/models/tiny2/load")  # one generation lane: tiny is swapped out
    tiny = _wait_lines(s, "tiny", 4)
    assert tiny[2].startswith("stopping (swapped out for tiny2) after ")
    assert re.fullmatch(
        r"stopped \(swapped out for tiny2\) after \d+\.\d s ready; the stop took \d+\.\d\d s", tiny[3]
    )

    pid = next(ln["pid"] for ln in _get(s.url + "/api/lanes")["lanes"] if ln["model"] == "tiny2")
    os.kill(pid, signal.SIGKILL)
    tiny2 = _wait_lines(s, "tiny2", 3)
    assert tiny2[:2] == ["starting", tiny2[1]] and tiny2[1].startswith("ready in ")
    assert re.fullmatch(
        r"failed: engine exited unexpectedly with code -9 \(.*\) after \d+\.\d s ready", tiny2[2]
    )
    assert "engine log:" not in tiny2[2]  # the engine's own lines stay in the lane's log

    _post(s.url + "/api/models/embed/load")  # ttl 1 s: unloaded for idleness soon after
    embed = _wait_lines(s, "embed", 4, within=30)
    assert embed[2].startswith("stopping (idle for 1 s) after ")
    assert embed[3].startswith("stopped (idle for 1 s) after ")

    time.sleep(0.5)  # nothing else happens to these lanes: no repeated or extra lines
    assert len(_lane_lines(s.stderr_text(), "tiny")) == 4
    assert len(_lane_lines(s.stderr_text(), "tiny2")) == 3
    assert len(_lane_lines(s.stderr_text(), "embed")) == 4


def _fake_engine(tmp_path: Path, body: str) -> str:
    """A stand-in for a llama-server binary: a Python script given llama-server's argv."""
    p = tmp_path / "fake-llama-server"
    p.write_text(f"#!{sys.executable}\nimport json, sys, time, socket\n" + body)
    p.chmod(0o755)
    return str(p)


_PORT = "port = int(sys.argv[sys.argv.index('--port') + 1])\n"


async def test_ready_line_is_enough_without_a_health_route(tmp_path: Path, model_store: Path) -> None:
    # nothing listens on the port at all: only the engine's own line can make this lane ready
    line = '{"switchyard": "listening", "port": %d, "ready": true}'
    binary = _fake_engine(tmp_path, _PORT + f"print({line!r} % port, flush=True)\ntime.sleep(60)\n")
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    settings = Settings.flat(models_dirs=(models,), runtime="llama-server", llama_server_path=binary)
    async with Runtime(settings=settings, paths=Paths.from_env()) as rt:
        t0 = time.monotonic()
        lane = await rt.supervisor.ensure("tiny")
        assert lane.state is LaneState.READY and lane.proc is not None and lane.proc.reported_ready.is_set()
        assert time.monotonic() - t0 < 5


async def test_health_polling_stays_the_fallback(tmp_path: Path, model_store: Path) -> None:
    # an engine that prints no ready line: 503 while "loading", then 200, as llama-server does
    body = _PORT + (
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "t0 = time.monotonic()\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if time.monotonic() - t0 > 0.4 else 503); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    settings = Settings.flat(
        models_dirs=(models,), runtime="llama-server", llama_server_path=_fake_engine(tmp_path, body)
    )
    async with Runtime(settings=settings, paths=Paths.from_env()) as rt:
        t0 = time.monotonic()
        lane = await rt.supervisor.ensure("tiny")
        assert lane.state is LaneState.READY and lane.proc is not None
        assert not lane.proc.reported_ready.is_set()
        assert 0.4 < time.monotonic() - t0 < 10


async def test_worker_reports_ready_and_logs_less_while_serving(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    async with Runtime(settings=Settings.flat(models_dirs=(models,)), paths=Paths.from_env()) as rt:
        lane = await rt.supervisor.ensure("tiny")
        assert lane.proc is not None and lane.proc.reported_ready.is_set()
        http = rt.supervisor.http
        async with http.get(lane.base_url + "/health") as r:  # the line came after loading: no 503
            assert r.status == 200
        snap = lane.snapshot()["measured"]
        assert snap is not None and snap["totals"]["kv_cache"] > 0  # load lines kept: the footprint
        mark = lane.ring.added
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with http.post(lane.base_url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
        await asyncio.sleep(0.3)  # the reader takes serving output in batches
        served = lane.ring.since(mark)
        assert any("print_timing" in ln for ln in served)  # a request's timings are still logged
        assert not any("init_sampler" in ln or "sampler chain" in ln for ln in served)  # debug lines are not


async def test_reader_takes_bulk_output_whole(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "out = sys.stdout.buffer\n"
        "for i in range(20000): out.write(b'line %d\\n' % i)\n"
        "out.write('caf\\u00e9 \\u2713\\r\\n'.encode())\n"
        "out.write(b'x' * 200000)\n"  # a runaway line, no newline, then end of output
        "out.flush()\n"
    )
    ring = LogRing(max_lines=30000, file=tmp_path / "lane.log")
    ports: list[int] = []
    proc = await EngineProcess.spawn(
        (sys.executable, "-c", script), env=dict(os.environ), ring=ring, on_port=ports.append
    )
    await proc.proc.wait()
    await proc.drain_output(5)
    lines = list(ring.lines)
    assert lines[:3] == ["line 0", "line 1", "line 2"] and lines[19999] == "line 19999"
    assert lines[20000] == "café ✓"  # decoded whole, CRLF ended
    assert "".join(lines[20001:]) == "x" * 200000 and all(len(ln) <= 1 << 20 for ln in lines)
    assert ring.added == len(lines) and ring.since(ring.added - 2) == lines[-2:]
    assert (tmp_path / "lane.log").read_text().splitlines()[:2] == ["line 0", "line 1"]
    assert ports == []


def test_layout_is_read_once_per_file_version(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec())
    first = read_gguf_layout(path)
    assert read_gguf_layout(path) is first  # unchanged file: not parsed again
    write_tiny_gguf(path, TinySpec(n_layer=3))
    again = read_gguf_layout(path)
    assert again is not first and getattr(again, "block_count", None) == 3
