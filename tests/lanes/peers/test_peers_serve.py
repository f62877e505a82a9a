"""Peers across real `switchyard serve --tls` processes, each with its own home, on 127.0.0.1.

Pairing through the CLI, wrong codes refused and then locked, a model of one machine answering through
another with the official openai client, a key that works only on its pinned mutual-TLS link, and
unpairing that takes the peer's models away on both sides; nothing left running.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.core.secrets import KeyStore
from app.lanes.peers import identity, pairing
from tests.conftest import REPO, ServerProcess, link_models, wait_gone

GRAMMAR = 'root ::= "the answer is 42"'


def trusting(server: ServerProcess) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(server.home / "tls" / "cert.pem"))


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(server.home))
    return subprocess.run(
        [sys.executable, "-m", "app", "peers", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def api(
    server: ServerProcess, method: str, path: str, body: Any = None, *, key: str | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    with httpx.Client(verify=trusting(server), timeout=30) as http:
        return http.request(method, server.url + path, json=body, headers=headers)


def invite(server: ServerProcess) -> dict[str, Any]:
    done = cli(server, "invite", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def wait_for(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.fixture
def three(
    tmp_path: Path, model_store: Path, start_server: Callable[..., ServerProcess]
) -> tuple[ServerProcess, ServerProcess, ServerProcess]:
    """a (no models), b (the tiny chat model), c (no models): three machines in all but the address."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with_model = link_models(tmp_path / "b-models", model_store / "tiny.gguf")
    started = [start_server(d, "--tls", wait=False) for d in (empty, with_model, empty)]
    a, b, c = (s.wait_ready(60) for s in started)
    return a, b, c


def join_by_hand(
    server: ServerProcess, folder: Path, *, admin_key: str | None
) -> tuple[identity.Identity, str]:
    """Redeem one of `server`'s codes from this process, as the protocol asks (docs/peers.md): the key
    it issues and the identity it pinned."""
    me = identity.load_or_make(folder)
    code = api(server, "POST", "/api/peers/invite", key=admin_key).json()["code"]
    fields = {
        "name": "by-hand",
        "host": "127.0.0.1",
        "port": 9,  # nothing listens: the server's checks of this peer fail, which is beside the point
        "server_cert": me.pem,
        "client_cert": me.pem,
        "key": "sk-sy-not-used",
        "seen": identity.fingerprint((server.home / "tls" / "cert.pem").read_bytes()),
    }
    body = {**fields, "proof": pairing.proof(code, role="join", fields=fields)}
    r = api(server, "POST", "/peer/pair", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    theirs = {k: answer[k] for k in ("name", "client_cert", "key")}
    assert answer["proof"] == pairing.proof(code, role="host", fields=theirs)
    return me, answer["key"]


def with_cert(server: ServerProcess, cert: identity.Identity | None) -> httpx.Client:
    ctx = trusting(server)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    return httpx.Client(verify=ctx, timeout=30)


@pytest.mark.parametrize("keys_required", [False, True], ids=["loopback", "keys-required"])
def test_peer_key_works_only_on_its_pinned_link(
    tmp_path: Path, start_server: Callable[..., ServerProcess], keys_required: bool
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    home = tmp_path / "home0"  # the home start_server gives its first server
    admin_key = None
    if keys_required:  # as on a LAN bind: every route but the open ones wants a key
        home.mkdir()
        (home / "settings.json").write_text(json.dumps({"require_api_key": True}))
        admin_key = KeyStore(home / "keys.json").create("tester").secret.reveal()
    server = start_server(empty, "--tls", wait=True)
    assert server.home == home
    me, key = join_by_hand(server, tmp_path / "me", admin_key=admin_key)  # /peer/pair is open
    other = identity.load_or_make(tmp_path / "other")  # a certificate the server never pinned
    auth = {"Authorization": f"Bearer {key}"}
    with with_cert(server, me) as http:
        ok = http.get(server.url + "/peer/info", headers=auth)
        assert ok.status_code == 200 and "hardware" in ok.json()
        assert http.get(server.url + "/v1/models", headers=auth).status_code == 200
        admin = http.get(server.url + "/api/keys", headers=auth)  # a peer is no administrator
        assert admin.status_code == 403 and admin.json()["error"]["code"] == "peer_not_trusted"
        if keys_required:  # the certificate alone opens no model API
            assert http.get(server.url + "/v1/models").status_code == 401
    with with_cert(server, None) as http:  # the key alone, as if it had leaked
        r = http.get(server.url + "/v1/models", headers=auth)
        assert r.status_code == 403 and r.json()["error"]["code"] == "peer_not_trusted"
        r = http.delete(server.url + "/peer/link")  # unpairing wants the pinned certificate
        assert r.status_code == 403 and r.json()["error"]["code"] == "peer_not_trusted"
    # an unknown client certificate: the handshake fails (under TLS 1.3 the client learns it as a
    # dropped connection)
    with pytest.raises(httpx.TransportError), with_cert(server, other) as http:
        http.get(server.url + "/v1/models", headers=auth)
    with with_cert(server, me) as http:  # unpairing on the certificate alone (a peer that lost its key)
        assert http.delete(server.url + "/peer/link").json() == {"name": "by-hand", "removed": True}
        r = http.get(server.url + "/peer/info", headers=auth)
        assert r.status_code == (401 if keys_required else 403)  # its key was revoked with it
    assert api(server, "GET", "/api/peers", key=admin_key).json()["peers"] == []


def address(server: ServerProcess) -> str:
    return server.url.split("//", 1)[1]


def test_pair_route_lock_and_unpair(three: tuple[ServerProcess, ServerProcess, ServerProcess]) -> None:
    a, b, c = three
    restarted: list[ServerProcess] = []
    try:
        pair_route_lock_and_unpair(a, b, c, restarted)
    finally:
        for s in restarted:
            s.stop()


def pair_route_lock_and_unpair(
    a: ServerProcess, b: ServerProcess, c: ServerProcess, restarted: list[ServerProcess]
) -> None:
    # pairing through the CLI: b invites, a redeems the code; both certificates pinned, both sides listed
    code = invite(b)
    assert code["fingerprint"] == api(b, "GET", "/api/peers").json()["fingerprint"]
    assert code["addresses"] == [address(b)]
    paired = cli(a, "add", address(b), "--code", code["code"], "--name", "bee", "--json")
    assert paired.returncode == 0, paired.stderr
    doc = json.loads(paired.stdout)
    assert doc["state"] == "ready" and doc["fingerprint"] == code["fingerprint"]
    assert [m["id"] for m in doc["models"]] == ["bee/tiny"]
    assert doc["hardware"]["memory"]["total"] > 0  # b's own probe, fetched at pairing
    again = cli(c, "add", address(b), "--code", code["code"])  # another machine, the same code
    assert again.returncode == 2 and "wrong pairing code" in again.stderr  # one use only
    itself = api(a, "POST", "/api/peers", {"address": address(a), "code": "ABCDE-FGHJK"})
    assert itself.status_code == 400 and "this server itself" in itself.json()["error"]["message"]
    dup = api(a, "POST", "/api/peers", {"address": address(b), "code": "ABCDE-FGHJK"})
    assert (
        dup.status_code == 409 and dup.json()["error"]["code"] == "peer_exists"
    )  # refused here, b untouched
    assert wait_for(lambda: [p["state"] for p in api(b, "GET", "/api/peers").json()["peers"]] == ["ready"])

    # b's model answers through a, with the official client
    client = openai.OpenAI(
        base_url=a.api, api_key="unused", http_client=httpx.Client(verify=trusting(a), timeout=60)
    )
    assert "bee/tiny" in [m.id for m in client.models.list()]
    answer = client.chat.completions.create(
        model="bee/tiny",
        messages=[{"role": "user", "content": "what is the answer?"}],
        max_tokens=16,
        extra_body={"grammar": GRAMMAR},
    )
    assert answer.choices[0].message.content == "the answer is 42"
    stream = client.chat.completions.create(
        model="bee/tiny",
        messages=[{"role": "user", "content": "what is the answer?"}],
        max_tokens=16,
        stream=True,
        extra_body={"grammar": GRAMMAR},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "the answer is 42"
    claude = anthropic.Anthropic(
        base_url=a.url, api_key="unused", http_client=anthropic.DefaultHttpxClient(verify=trusting(a))
    )
    said = claude.messages.create(
        model="bee/tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )  # another surface, translated here and answered there
    assert said.type == "message" and said.usage.output_tokens > 0
    env = dict(os.environ, SWITCHYARD_HOME=str(a.home))
    explained = subprocess.run(
        [sys.executable, "-m", "app", "explain", "bee/tiny", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert explained.returncode == 0, explained.stderr
    where = json.loads(explained.stdout)
    assert where["machine"]["peer"] == "bee" and where["machine"]["url"] == b.api
    assert where["decision_text"].startswith("runs on peer 'bee'") and where["fit"]["chosen"]["fits"]
    listed = cli(a, "ls")
    assert listed.returncode == 0 and "bee" in listed.stdout and "ready" in listed.stdout, listed.stderr
    checked = cli(a, "check", "bee", "--json")
    assert checked.returncode == 0, checked.stderr
    info = json.loads(checked.stdout)["info"]
    assert info["hardware"]["memory"]["total"] > 0 and [m["id"] for m in info["models"]] == ["tiny"]

    # a restart (same home, same port): the peer is attached again from peers.json, and b's client
    # certificate is trusted again, so b reaches a as before
    port = int(a.url.rsplit(":", 1)[1])
    assert a.stop() == 0
    a = ServerProcess(a.home, a.models_dir, "--tls", port=port).wait_ready(60)
    restarted.append(a)
    assert wait_for(lambda: "bee/tiny" in [m["id"] for m in api(a, "GET", "/v1/models").json()["data"]])
    name_on_b = api(b, "GET", "/api/peers").json()["peers"][0]["name"]
    assert api(b, "POST", f"/api/peers/{name_on_b}/check").json()["state"] == "ready"
    client = openai.OpenAI(
        base_url=a.api, api_key="unused", http_client=httpx.Client(verify=trusting(a), timeout=60)
    )

    # the peer routes want a paired peer's key on its pinned link: a plain client gets nothing
    r = api(b, "GET", "/peer/info")
    assert r.status_code == 403 and r.json()["error"]["code"] == "peer_not_trusted"

    # c guesses codes: each wrong one is refused, the fifth (the reused code above was the first) locks
    # pairing on b, even for a code still open
    held = invite(b)
    for n in range(2, 6):
        r = api(c, "POST", "/api/peers", {"address": address(b), "code": f"{n}{n}{n}{n}{n}-AAAAA"})
        want = (403, "pairing_code_wrong") if n < 5 else (429, "pairing_locked")
        assert (r.status_code, r.json()["error"]["code"]) == want, r.text
    r = api(c, "POST", "/api/peers", {"address": address(b), "code": held["code"]})
    assert r.status_code == 429, r.text  # the right code, too late: the lock voided every open code
    assert api(b, "POST", "/api/peers/invite").status_code == 429
    assert api(b, "GET", "/api/peers").json()["pairing"]["locked_for_s"] > 0
    assert api(c, "GET", "/api/peers").json()["peers"] == []
    assert [k["name"] for k in api(c, "GET", "/api/keys").json()["keys"]] == []  # each try's key revoked
    assert len(api(b, "GET", "/api/peers").json()["peers"]) == 1  # the pairing made before still stands

    # unpairing: the models leave a at once, b is told and forgets a (a lost b's key at its restart: no
    # keyring here; its pinned certificate is enough to unpair), and the keys are revoked both sides
    gone = cli(a, "rm", "bee")
    assert gone.returncode == 0, gone.stderr
    assert "bee/tiny" not in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="bee/tiny", messages=[{"role": "user", "content": "hi"}])
    assert api(b, "GET", "/api/peers").json()["peers"] == []
    for s in (a, b):
        assert not [k for k in api(s, "GET", "/api/keys").json()["keys"] if k["name"].startswith("peer.")]

    engines = b.engine_pids()
    assert engines  # b ran the model
    for s in (a, b, c):
        assert s.stop() == 0
    assert wait_gone(engines, 10) == []


def test_peers_need_a_tls_server(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    home = tmp_path / "nobody"
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    none = subprocess.run(
        [sys.executable, "-m", "app", "peers", "ls"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert none.returncode == 2 and "switchyard serve --tls" in none.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    plain = start_server(empty)
    refused = cli(plain, "invite")
    assert refused.returncode == 2 and "serve --tls" in refused.stderr, refused.stderr
    with httpx.Client(timeout=30) as http:
        r = http.post(plain.url + "/api/peers", json={"address": "127.0.0.1:1", "code": "ABCDE-FGHJK"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "peers_need_tls"
