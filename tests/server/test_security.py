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


def cli(home: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_API_KEY"}  # only the key a test gives
    env.update(SWITCHYARD_HOME=str(home), PYTHON_KEYRING_BACKEND=FAIL_KEYRING, **extra_env)
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
    assert (
        s.security.require_api_key,
        s.security.allowed_hosts,
        s.security.cors_origins,
        s.security.allow_remote_admin,
    ) == (
        False,
        (),
        (),
        False,
    )
    s = settings_from_mapping({"cors_origins": [ORIGIN], "allowed_hosts": ["box.lan", "fe80::1"]})
    assert s.security.cors_origins == (ORIGIN,) and s.security.allowed_hosts == ("box.lan", "fe80::1")


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
    for origin in ("http://evil.example", "http://localhost:3000"):  # foreign, and local but unlisted
        pre = req(
            local.url,
            "/v1/chat/completions",
            method="OPTIONS",
            Origin=origin,
            Access_Control_Request_Method="POST",
            Access_Control_Request_Private_Network="true",
        )
        # Private Network Access: only a listed origin is told it may reach this private address
        assert pre.status_code in (403, 405) and cors_headers(pre) == [], origin


def test_only_the_servers_own_origin_passes_unlisted(local: ServerProcess) -> None:
    """Another port on localhost is another program's page: refused like any foreign site."""
    r = req(local.url, Origin="http://localhost:3000")
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    own = local.url.replace("127.0.0.1", "localhost")
    r = req(local.url, Origin=own)
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


def test_ipv6_loopback_bind_checks_host_too(tmp_path: Path) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    make_home(tmp_path / "home")
    s = start(tmp_path / "home", link_models(tmp_path / "models"), "--host", "::1")
    try:
        assert s.url.startswith("http://[::1]:")
        assert req(s.url, "/v1/models").status_code == 200  # Host: [::1]:port, no key needed on loopback
        r = req(s.url, "/v1/models", Host="attacker.example")
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        assert req(s.url, "/v1/models", Origin="http://evil.example").status_code == 403
    finally:
        stop(s)


# ---- LAN bind ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "lan"])
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
    key = make_home(base / "home", {"allow_plain_lan": True}, key="editor")  # plain HTTP: test_harden_tls
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
    key = make_home(tmp_path / "home", {"allow_remote_admin": True, "allow_plain_lan": True}, key="ops")
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


# ---- the CLI against a server that requires keys ------------------------------------------------------
def test_ps_and_explain_send_the_key_and_say_what_to_do_on_401(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    key = make_home(home, {"require_api_key": True}, key="cli")
    s = start(home, link_models(tmp_path / "models", model_store / "tiny.gguf"))
    try:
        # require_api_key: keys are needed on a loopback bind too, by every surface
        assert req(s.url).status_code == 401 and req(s.url, "/api/tags").status_code == 401
        assert req(s.url, Authorization=f"Bearer {key}").status_code == 200
        for command in (["ps"], ["explain", "tiny"]):
            done = cli(home, *command)
            assert done.returncode == 2, done.stdout
            assert "requires an API key" in done.stderr and "--api-key" in done.stderr
            assert "SWITCHYARD_API_KEY" in done.stderr and "switchyard keys create" in done.stderr
            done = cli(home, *command, "--api-key", key[:-1] + "x")
            assert done.returncode == 2 and "refused the API key" in done.stderr
            assert key not in done.stderr and key[:-1] not in done.stderr
        done = cli(home, "ps", "--api-key", key)
        assert done.returncode == 0, done.stderr
        assert "no lanes yet" in done.stdout
        done = cli(home, "ps", "--json", SWITCHYARD_API_KEY=key)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["lanes"] == []
        done = cli(home, "explain", "tiny", "--json", SWITCHYARD_API_KEY=key)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["decision"]["lane"] == "llama.cpp"
        assert any("/api/models/tiny/explain" in ln and "client=cli" in ln for ln in s.stderr)
        assert key not in s.stderr_text()
    finally:
        stop(s)


def test_ps_reaches_a_wildcard_bind_through_loopback(lan: tuple[ServerProcess, str, str]) -> None:
    s, key, _ = lan
    recorded = json.loads((s.home / "server.json").read_text())["url"]
    assert recorded.startswith("http://127.0.0.1:")  # 0.0.0.0 is no address to dial, nor an allowed Host
    done = cli(s.home, "ps", "--json", "--api-key", key)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["url"] == recorded


def test_secrets_planted_in_settings_never_show_in_logs_errors_or_api_output(
    tmp_path: Path, model_store: Path
) -> None:
    """An HF token (the opt-in 0600 file, and HF_TOKEN), a proxy password in settings.json and an API key,
    against a debug-logging server: every GET route, error answers, refusals and a lane start."""
    hf_token, password = "hf_plantedTOKENabcdef123456", "pr0xyPASSplanted"
    home = tmp_path / "home"
    key = make_home(
        home,
        {"hf_token_file": True, "hf_proxy": f"http://user:{password}@127.0.0.1:9", "require_api_key": True},
        key="editor",
    )
    (home / "hf_token").write_text(hf_token)
    (home / "hf_token").chmod(0o600)
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHON_KEYRING_BACKEND", FAIL_KEYRING)
        mp.setenv("HF_TOKEN", hf_token)
        s = ServerProcess(home, models, "--log-level", "debug").wait_ready()
    try:
        auth = {"Authorization": f"Bearer {key}"}
        doc = req(s.url, "/openapi.json", **auth).json()
        outputs = [
            req(s.url, path, **auth).text
            for path, ops in doc["paths"].items()
            if "get" in ops and "{" not in path and not path.endswith("/events")  # streams: never end
        ]
        outputs.append(req(s.url, "/api/lanes/tiny/logs", **auth).text)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        outputs.append(httpx.post(s.url + "/v1/chat/completions", json=chat, headers=auth, timeout=60).text)
        outputs.append(req(s.url, "/api/lanes/tiny/logs", **auth).text)  # the engine's own output
        outputs.append(
            httpx.post(s.url + "/v1/chat/completions", content=b"{", headers=auth, timeout=30).text
        )
        outputs.append(req(s.url, "/v1/models", Authorization=f"Bearer {key}x").text)
        outputs.append(req(s.url, "/v1/models", Authorization=f"Bearer {hf_token}").text)
        outputs.append(req(s.url, "/api/tags", x_api_key=password).text)
    finally:
        stop(s)
    logs = s.stderr_text() + "\n".join(s.stdout)
    assert "status=401" in logs and "POST /v1/chat/completions" in logs  # the log saw those requests
    files = [f.read_text(errors="replace") for f in home.rglob("*.log") if f.is_file()]  # lane logs
    assert files  # the engine's output was kept, and is searched too
    texts = [*outputs, logs, *files]
    leaks = [(secret[:6], t[:300]) for secret in (hf_token, key) for t in texts if secret in t]
    assert leaks == []
    proxy_leaks = [t[:300] for t in texts if password in t]
    assert proxy_leaks == []
