"""Safe by default, against a real `switchyard serve`: Host and Origin checks, CORS, API keys on a LAN bind
(reached through this machine's own non-loopback address), the admin gate, and secrets kept out of logs."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import psutil
import pytest

from app.core.errors import SettingsError
from app.core.settings import settings_from_mapping
from tests.conftest import REPO, ServerProcess, link_models, wait_gone

FAIL_KEYRING = "keyring.backends.fail.Keyring"
ORIGIN = "http://app.example:5173"


def lan_ip() -> str:
    for snics in psutil.net_if_addrs().values():
        for s in snics:
            if s.family == socket.AF_INET and not ipaddress.ip_address(s.address).is_loopback:
                return str(s.address)
    pytest.skip("this machine has no non-loopback IPv4 address")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHON_KEYRING_BACKEND=FAIL_KEYRING)
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def make_home(home: Path, settings: dict[str, Any] | None = None, key: str | None = None) -> str:
    """A SWITCHYARD_HOME with these settings and (when `key` names one) a key made by the CLI."""
    home.mkdir(parents=True, exist_ok=True)
    if settings:
        (home / "settings.json").write_text(json.dumps(settings))
    if not key:
        return ""
    done = cli(home, "keys", "create", key)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def start(home: Path, models: Path, *extra: str) -> ServerProcess:
    with pytest.MonkeyPatch.context() as mp:  # module fixtures run before the autouse isolation
        mp.setenv("PYTHON_KEYRING_BACKEND", FAIL_KEYRING)
        return ServerProcess(home, models, *extra).wait_ready()


def stop(s: ServerProcess) -> None:
    pids = s.engine_pids()
    s.stop()
    wait_gone(pids, 5)


def req(url: str, path: str = "/v1/models", *, method: str = "GET", **headers: str) -> httpx.Response:
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    return httpx.request(method, url + path, headers=hdrs, timeout=30)


def cors_headers(r: httpx.Response) -> list[str]:
    return [h for h in r.headers if h.lower().startswith("access-control-")]


# ---- settings --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        {"cors_origins": ["*"]},
        {"cors_origins": ["null"]},
        {"cors_origins": ["http://a.example/app"]},
        {"cors_origins": "http://a.example"},
        {"allowed_hosts": ["*"]},
        {"allowed_hosts": ["box.lan:8686"]},
        {"allowed_hosts": ["http://box.lan"]},
        {"require_api_key": "yes"},
    ],
)
def test_security_settings_are_checked(raw: dict[str, Any]) -> None:
    with pytest.raises(SettingsError):
        settings_from_mapping(raw)


def test_security_settings_defaults_and_values() -> None:
    s = settings_from_mapping({})
    assert (s.require_api_key, s.allowed_hosts, s.cors_origins, s.allow_remote_admin) == (
        False,
        (),
        (),
        False,
    )
    s = settings_from_mapping({"cors_origins": [ORIGIN], "allowed_hosts": ["box.lan", "fe80::1"]})
    assert s.cors_origins == (ORIGIN,) and s.allowed_hosts == ("box.lan", "fe80::1")


# ---- loopback: Host, Origin, CORS ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("sec-local")
    make_home(base / "home", {"cors_origins": [ORIGIN], "allowed_hosts": ["switchyard.lan"]})
    s = start(base / "home", link_models(base / "models"))
    yield s
    stop(s)


def test_foreign_host_is_refused_and_listed_names_pass(local: ServerProcess) -> None:
    r = req(local.url, "/health", Host="attacker.example")
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert req(local.url, "/health", Host="switchyard.lan:8686").status_code == 200
    assert req(local.url, "/health", Host="192.0.2.99").status_code == 403  # not ours on a loopback bind


def test_keys_are_not_needed_on_loopback_by_default(local: ServerProcess) -> None:
    assert req(local.url).status_code == 200
    assert req(local.url, Authorization="Bearer not-a-key").status_code == 200


def test_disallowed_origin_gets_403_and_no_cors_headers(local: ServerProcess) -> None:
    r = req(local.url, Origin="http://evil.example")
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert cors_headers(r) == []
    pre = req(
        local.url,
        "/v1/chat/completions",
        method="OPTIONS",
        Origin="http://evil.example",
        Access_Control_Request_Method="POST",
    )
    assert pre.status_code == 403 and cors_headers(pre) == []


def test_local_unlisted_origin_passes_without_cors_headers(local: ServerProcess) -> None:
    r = req(local.url, Origin="http://localhost:3000")
    assert r.status_code == 200 and cors_headers(r) == []


def test_listed_origin_gets_its_exact_origin_and_a_preflight(local: ServerProcess) -> None:
    r = req(local.url, Origin=ORIGIN)
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN and "Origin" in r.headers["Vary"]
    pre = req(
        local.url,
        "/v1/chat/completions",
        method="OPTIONS",
        Origin=ORIGIN,
        Access_Control_Request_Method="POST",
        Access_Control_Request_Headers="authorization, content-type, x-stainless-os",
        Access_Control_Request_Private_Network="true",
    )
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in pre.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "x-api-key", "content-type", "x-stainless-os"} <= allowed
    assert pre.headers["Access-Control-Allow-Private-Network"] == "true"
    assert all("*" not in v for k, v in pre.headers.items() if k.lower().startswith("access-control-"))


# ---- LAN bind ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "lan"])
def test_lan_bind_without_a_key_is_refused(tmp_path: Path, host: str) -> None:
    host = lan_ip() if host == "lan" else host
    make_home(tmp_path / "home")
    done = cli(tmp_path / "home", "serve", "--host", host, "--port", "0", "--models-dir", str(tmp_path))
    assert done.returncode == 2
    assert f"refusing to bind {host}" in done.stderr and "no API key exists" in done.stderr
    assert "switchyard keys create NAME" in done.stderr
    assert "listening" not in done.stdout


@pytest.fixture(scope="module")
def lan(
    tmp_path_factory: pytest.TempPathFactory, model_store: Path
) -> Iterator[tuple[ServerProcess, str, str]]:
    ip = lan_ip()
    base = tmp_path_factory.mktemp("sec-lan")
    key = make_home(base / "home", key="editor")
    s = start(base / "home", link_models(base / "models", model_store / "tiny.gguf"), "--host", "0.0.0.0")
    port = s.url.rsplit(":", 1)[1]
    yield s, key, f"http://{ip}:{port}"
    stop(s)


def test_missing_or_wrong_key_is_401_in_each_surfaces_shape(lan: tuple[ServerProcess, str, str]) -> None:
    _, key, url = lan
    r = req(url)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "switchyard keys create" in r.json()["error"]["message"]
    r = req(url, Authorization=f"Bearer {key[:-1]}x")
    assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
    r = req(url, "/v1/messages", method="POST")
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    r = req(url, "/api/tags")
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    assert req(url, "/health").status_code == 200  # open, for monitors


def test_official_clients_need_the_right_key(lan: tuple[ServerProcess, str, str]) -> None:
    s, key, url = lan
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=url).list()
    assert exc.value.status_code == 401

    oa = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
    assert [m.id for m in oa.models.list()] == ["tiny"]
    an = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)  # sends x-api-key
    m = an.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert m.type == "message" and m.model == "tiny"
    assert [
        x.model for x in ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"}).list().models
    ]
    assert any("GET /v1/models" in ln and "status=200" in ln and "client=editor" in ln for ln in s.stderr)


def test_host_header_is_checked_on_a_lan_bind(lan: tuple[ServerProcess, str, str]) -> None:
    _, key, url = lan
    auth = {"Authorization": f"Bearer {key}"}
    assert req(url, **auth).status_code == 200  # Host: <this machine's address>:port
    r = req(url, Host="attacker.example", **auth)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"


def test_admin_from_the_network_is_refused_even_with_a_key(lan: tuple[ServerProcess, str, str]) -> None:
    s, key, url = lan
    auth = {"Authorization": f"Bearer {key}"}
    for method, path in [
        ("GET", "/api/lanes"),
        ("GET", "/api/keys"),
        ("GET", "/api/models"),
        ("GET", "/api/hardware"),
        ("POST", "/api/models/tiny/load"),
        ("GET", "/api/models/tiny/explain"),
    ]:
        r = req(url, path, method=method, **auth)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_not_allowed", path
    assert req(url, "/api/tags", **auth).status_code == 200  # Ollama's client API is not admin
    local = s.url.replace("0.0.0.0", "127.0.0.1")
    assert req(local, "/api/lanes", **auth).status_code == 200
    assert req(local, "/api/lanes").status_code == 401  # a LAN bind needs a key from loopback too


def test_remote_admin_when_allowed_still_needs_a_key(tmp_path: Path) -> None:
    url_ip = lan_ip()
    key = make_home(tmp_path / "home", {"allow_remote_admin": True}, key="ops")
    s = start(tmp_path / "home", link_models(tmp_path / "models"), "--host", url_ip)
    try:
        assert req(s.url, "/api/lanes", Authorization=f"Bearer {key}").status_code == 200
        assert req(s.url, "/api/lanes", x_api_key=key).status_code == 200
        assert req(s.url, "/api/lanes").status_code == 401
    finally:
        stop(s)


def test_the_secret_never_shows_in_logs_lists_or_api_output(lan: tuple[ServerProcess, str, str]) -> None:
    s, key, _ = lan
    local = s.url.replace("0.0.0.0", "127.0.0.1")
    outputs = [
        req(local, path, Authorization=f"Bearer {key}").text
        for path in ("/api/keys", "/api/lanes", "/api/models", "/v1/models", "/api/ps")
    ]
    listed = cli(s.home, "keys", "list")
    outputs += [listed.stdout, listed.stderr, cli(s.home, "keys", "list", "--json").stdout]
    outputs.append((s.home / "keys.json").read_text())
    assert key[-4:] in listed.stdout  # what is shown instead: the last 4 characters
    assert s.stderr and not [o for o in [*outputs, s.stderr_text(), "\n".join(s.stdout)] if key in o]
