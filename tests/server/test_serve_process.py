"""`switchyard serve` as a real process: crashes, disconnects, swaps, TTL, shutdown, CLI."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.conftest import REPO, link_models, wait_gone
from tests.support.tinymodels import write_unknown_arch_gguf


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def lane(server_url: str, model: str) -> dict[str, Any]:
    return next(ln for ln in get(server_url + "/api/lanes")["lanes"] if ln["model"] == model)


def wait_for(pred: Any, timeout: float = 10, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not met in time")


LONG = {
    "messages": [{"role": "user", "content": "tell me everything"}],
    "max_tokens": 4000,
    "stream": True,
    "ignore_eos": True,
}


def test_kill_engine_mid_stream_gives_error_then_restarts(
    start_server: Any, tmp_path: Path, large_model: Path
) -> None:
    s = start_server(link_models(tmp_path / "m", large_model))
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0, timeout=60)
    stream = c.chat.completions.create(
        model="large",
        stream=True,
        max_tokens=4000,
        messages=[{"role": "user", "content": "go"}],
        extra_body={"ignore_eos": True},
    )
    got = 0
    t_kill = 0.0
    with pytest.raises(openai.APIError) as exc:
        for _chunk in stream:
            got += 1
            if got == 5:
                pid = lane(s.url, "large")["pid"]
                psutil.Process(pid).kill()
                t_kill = time.monotonic()
    assert time.monotonic() - t_kill < 5, "the client must not hang after the engine dies"
    assert "failed mid-request" in str(exc.value)
    assert wait_for(lambda: lane(s.url, "large")["state"] == "failed", timeout=1.0)
    r = c.chat.completions.create(
        model="large", messages=[{"role": "user", "content": "again"}], max_tokens=3
    )
    assert r.choices[0].finish_reason in ("length", "stop")
    assert lane(s.url, "large")["restarts"] == 1


def test_kill_engine_mid_request_non_stream_is_502(
    start_server: Any, tmp_path: Path, large_model: Path
) -> None:
    s = start_server(link_models(tmp_path / "m", large_model))
    post(s.url + "/api/models/large/load")
    pid = lane(s.url, "large")["pid"]
    threading.Timer(0.5, lambda: psutil.Process(pid).kill()).start()
    body = {
        "model": "large",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3000,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        s.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=60)
    assert exc.value.code == 502
    err = json.loads(exc.value.read())["error"]
    assert err["code"] == "engine_crashed" and err["source"] == "engine"


def test_client_disconnect_frees_the_engine_slot(
    start_server: Any, tmp_path: Path, large_model: Path
) -> None:
    s = start_server(link_models(tmp_path / "m", large_model))
    post(s.url + "/api/models/large/load")
    engine = f"http://127.0.0.1:{lane(s.url, 'large')['port']}"
    host, port = s.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps({"model": "large", **LONG}),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(5):
        assert resp.fp.readline()  # a few SSE lines have arrived
    assert any(slot["is_processing"] for slot in get(engine + "/slots"))
    resp.close()
    conn.close()
    t0 = time.monotonic()
    wait_for(lambda: not any(slot["is_processing"] for slot in get(engine + "/slots")), timeout=10)
    # 4000 tokens at ~8 ms would take ~30 s: the slot was freed by the disconnect, not by finishing
    assert time.monotonic() - t0 < 10
    assert wait_for(lambda: lane(s.url, "large")["in_flight"] == 0, timeout=5)


def test_jit_swap_between_two_models(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf", model_store / "tiny2.gguf"))
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0)
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    first_pid = lane(s.url, "tiny")["pid"]
    c.chat.completions.create(model="tiny2", messages=[{"role": "user", "content": "b"}], max_tokens=2)
    assert lane(s.url, "tiny")["state"] == "stopped" and lane(s.url, "tiny2")["state"] == "ready"
    assert wait_gone([first_pid], 5) == []
    loaded = {m.id: m.model_extra["loaded"] for m in c.models.list()}  # type: ignore[index]
    assert loaded == {"tiny": False, "tiny2": True}


def test_ttl_unload_over_http(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf"), "--ttl", "1")
    post(s.url + "/api/models/tiny/load")
    pid = lane(s.url, "tiny")["pid"]
    assert wait_for(lambda: lane(s.url, "tiny")["state"] == "stopped", timeout=5)
    assert wait_gone([pid], 5) == []


def test_load_unload_lanes_and_logs(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf"))
    snap = post(s.url + "/api/models/tiny/load")
    assert snap["state"] == "ready" and snap["pid"] and snap["port"] and snap["in_flight"] == 0
    assert set(snap) >= {"state", "model", "pid", "port", "started_at", "last_used", "in_flight"}
    logs = get(s.url + "/api/lanes/tiny/logs?lines=500")["lines"]
    assert any("starting tiny" in ln for ln in logs) and any("llama" in ln.lower() for ln in logs)
    snap = post(s.url + "/api/models/tiny/unload")
    assert snap["state"] == "stopped" and snap["pid"] is None
    with pytest.raises(urllib.error.HTTPError) as exc:
        get(s.url + "/api/lanes/nothing/logs")
    assert exc.value.code == 404
    log_file = s.home / "logs" / "lanes" / "tiny.log"
    assert "engine stopped" in log_file.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_no_engine_left_after_graceful_stop(
    start_server: Any, tmp_path: Path, model_store: Path, sig: int
) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf", model_store / "embed.gguf"))
    post(s.url + "/api/models/tiny/load")
    post(s.url + "/api/models/embed/load")
    pids = s.engine_pids()
    assert len(pids) == 2
    assert s.stop(sig) == 0
    assert wait_gone(pids, 5) == []
    assert not (s.home / "server.json").exists()


def test_no_engine_left_after_sigkill_of_server(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf"))
    post(s.url + "/api/models/tiny/load")
    pids = s.engine_pids()
    assert pids
    s.stop(signal.SIGKILL)
    assert wait_gone(pids, 6) == [], "an engine outlived a SIGKILLed server"


def test_port_in_use_fails_and_names_the_holder(start_server: Any, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        s = start_server(tmp_path / "m", port=port, wait=False)
        rc = s.proc.wait(30)
        time.sleep(0.2)
        err = s.stderr_text()
    assert rc == 2
    assert f"port {port}" in err and "already in use" in err and "--port" in err
    assert "listening on" not in "\n".join(s.stdout)


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "SWITCHYARD_HOME": str(home),
        "HOME": str(home),
        "SWITCHYARD_NO_STARTER": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_ls_and_ps(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf", model_store / "embed.gguf")
    (models / "org" / "repo").mkdir(parents=True)
    (models / "org" / "repo" / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    out = run_cli(tmp_path / "h", "ls", "--json", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    listed = {m["id"]: m for m in json.loads(out.stdout)["models"]}
    assert listed["tiny"]["kind"] == "chat" and listed["embed"]["kind"] == "embedding"
    assert listed["org/repo/bad"]["status"] == "broken"
    table = run_cli(tmp_path / "h", "ls", "--models-dir", str(models))
    assert "tiny" in table.stdout and "broken" in table.stdout

    s = start_server(models)
    post(s.url + "/api/models/tiny/load")
    ps = run_cli(s.home, "ps", "--json")
    assert ps.returncode == 0, ps.stderr
    lanes = json.loads(ps.stdout)["lanes"]
    assert [(ln["model"], ln["state"]) for ln in lanes] == [("tiny", "ready")]
    assert "ready" in run_cli(s.home, "ps").stdout

    gone = run_cli(tmp_path / "empty", "ps", "--url", "http://127.0.0.1:9")
    assert gone.returncode == 2 and "no Switchyard server answers" in gone.stderr


def test_version_command() -> None:
    out = subprocess.run([sys.executable, "-m", "app", "--version"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("switchyard ")


def test_malformed_settings_file_refuses_to_start(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "settings.json").write_text("{oops")
    out = run_cli(home, "serve", "--port", "0")
    assert out.returncode == 2 and "settings.json is not valid JSON" in out.stderr
    assert (home / "settings.json").read_text() == "{oops"


def test_non_loopback_bind_is_refused(tmp_path: Path) -> None:
    out = run_cli(tmp_path / "h", "serve", "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2 and "refusing to bind 0.0.0.0" in out.stderr and "127.0.0.1" in out.stderr


def test_missing_model_file_over_http(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    s = start_server(models)
    (models / "tiny2.gguf").unlink()
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="tiny2"):
        c.chat.completions.create(model="tiny2", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.choices  # the rest keeps serving


def test_engine_start_failure_is_503_with_reason(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    write_unknown_arch_gguf(models / "alien.gguf")
    s = start_server(models)
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError) as exc:
        c.chat.completions.create(model="alien", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 503
    body = exc.value.body
    assert isinstance(body, dict) and body["code"] == "engine_start_failed" and body["source"] == "engine"
    assert "nosucharch" in body["message"]
    assert lane(s.url, "alien")["state"] == "failed"
    assert c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def _stream_lines(url: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    lines = [ln.decode().rstrip("\r\n") for ln in resp if ln.strip()]
    conn.close()
    return resp.status, lines


def test_streaming_client_hears_the_loading_phase(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    write_unknown_arch_gguf(models / "alien.gguf")
    s = start_server(models)
    ask = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 32,
        "stream": True,
        "grammar": 'root ::= "the answer is 42"',
    }
    status, lines = _stream_lines(s.url, {"model": "tiny", **ask})
    assert status == 200 and lines[0].startswith(": switchyard: loading tiny (")
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln.removeprefix("data: ")) for ln in lines if ln.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text == "the answer is 42"
    # once loaded, a stream goes straight to the engine's bytes
    status, lines = _stream_lines(s.url, {"model": "tiny", **ask})
    assert status == 200 and lines[0].startswith("data: ")
    # a start that fails after the stream began ends it with an error event saying why
    status, lines = _stream_lines(s.url, {"model": "alien", **ask})
    assert status == 200 and lines[0].startswith(": switchyard: loading alien (")
    err = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert err["code"] == "engine_start_failed" and "nosucharch" in err["message"]
