"""Hostile input never gets a 5xx, and browsers cannot drive the admin API: a corpus of hostile bodies,
query strings and path values sent to every route of a real `switchyard serve` (from its own
/openapi.json), raw HTTP/1.0 without a Host header, and "simple" cross-origin requests from another port."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Callable
from urllib.parse import quote, urlsplit

import httpx
import pytest
import yarl

from tests.conftest import ServerProcess
from tests.support.harden_corpus import (
    JSON,
    QUERY_NAMES,
    QUERY_VALUES,
    Route,
    acceptable,
    body_cases,
    hostile_server,
    live,
    routes_of,
)

__all__ = ["hostile_server"]  # the module-scoped server fixture, shared by the tests below


def _send(client: httpx.Client, method: str, path: str, **kw: object) -> httpx.Response:
    """The answer; a dropped connection reads as a 599, a failure like any 5xx."""
    try:
        return client.request(method, path, **kw)  # type: ignore[arg-type]
    except httpx.TransportError as exc:
        return httpx.Response(599, text=f"no answer: {exc!r}")


def _failures(client: httpx.Client, routes: list[Route]) -> list[str]:
    """'METHOD path [case] -> status' for every 5xx answer of the corpus on `routes`."""
    bad = []
    cases = body_cases()
    for route in routes:
        if not route.has_body:
            continue
        for path in route.paths():
            for case in cases if "{" not in route.template or path.endswith("nosuch") else cases[:12]:
                r = _send(client, route.method, path, content=case.body, headers=case.headers)
                if not acceptable(r):
                    bad.append(f"{route.method} {path[:80]} [{case.label}] -> {r.status_code} {r.text[:160]}")
    return bad


def test_hostile_bodies_never_get_a_5xx_on_any_route(hostile_server: ServerProcess) -> None:
    routes = routes_of(hostile_server.url)
    assert len([r for r in routes if r.has_body]) > 40  # the document lists every route, not a few
    with httpx.Client(base_url=hostile_server.url, timeout=120) as client:
        bad = _failures(client, routes)
    assert not bad, "\n".join(bad)
    assert live(hostile_server.url)


def test_hostile_query_strings_and_paths_never_get_a_5xx(hostile_server: ServerProcess) -> None:
    bad = []
    with httpx.Client(base_url=hostile_server.url, timeout=120) as client:
        # a lane exists, so /api/lanes/tiny/logs reaches its `lines` parameter
        assert client.post("/api/models/tiny/load").status_code == 200
        for route in routes_of(hostile_server.url):
            if route.method not in ("GET", "DELETE"):
                continue
            for path in [*route.paths(), route.template.replace("{lane_id}", "tiny")]:
                if "{" in path:
                    continue
                for value in QUERY_VALUES:
                    query = "&".join(f"{n}={quote(value)}" for n in QUERY_NAMES)
                    r = client.request(route.method, f"{path}?{query}")
                    if not acceptable(r):
                        bad.append(f"{route.method} {path[:60]}?…={value[:10]!r} -> {r.status_code} {r.text}")
    assert not bad, "\n".join(bad)
    assert live(hostile_server.url)


def test_non_ascii_digits_in_a_query_are_a_400_naming_the_parameter(hostile_server: ServerProcess) -> None:
    with httpx.Client(base_url=hostile_server.url, timeout=60) as client:
        assert client.post("/api/models/tiny/load").status_code == 200
        for path, name in [("/api/lanes/tiny/logs?lines=", "lines"), ("/api/hub/search?limit=", "limit")]:
            for value in ("٣", "²", "9" * 40):
                r = client.get(path + quote(value))
                assert r.status_code == 400, (path, value, r.text)
                assert r.json()["error"]["param"] == name
        assert client.get("/api/lanes/tiny/logs?lines=3").status_code == 200


@pytest.mark.parametrize(
    ("label", "body", "param"),
    [
        (
            "huge int",
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": '
            + b"9" * 30
            + b"}",
            "max_tokens",
        ),
        (
            "nested huge int",
            b'{"model": "tiny", "options": {"num_ctx": ' + b"9" * 25 + b"}}",
            "options.num_ctx",
        ),
        ("NaN", b'{"model": "tiny", "temperature": NaN}', "temperature"),
        ("overflowing float", b'{"model": "tiny", "temperature": 1e999}', "temperature"),
        ("lone surrogate", b'{"model": "\\ud800"}', "model"),
    ],
)
def test_hostile_values_are_a_400_that_names_the_field(
    hostile_server: ServerProcess, label: str, body: bytes, param: str
) -> None:
    r = httpx.post(hostile_server.url + "/v1/chat/completions", content=body, headers=JSON, timeout=30)
    assert r.status_code == 400, (label, r.text)
    assert r.json()["error"]["param"] == param, r.text


def test_a_nul_in_what_was_said_is_text_but_in_a_name_is_refused(hostile_server: ServerProcess) -> None:
    """A model may write a NUL (random weights do); the client sends that reply back in its history, and the
    conversation must go on. In a name (the model's) a NUL would reach C and OS calls: refused."""
    url = hostile_server.url + "/v1/chat/completions"
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a\u0000b"},
        {"role": "user", "content": "go on"},
    ]
    said = httpx.post(url, json={"model": "tiny", "messages": history, "max_tokens": 2}, timeout=60)
    assert said.status_code == 200, said.text
    named = httpx.post(url, json={"model": "ti\u0000ny", "messages": history[:1]}, timeout=30)
    assert named.status_code == 400 and named.json()["error"]["param"] == "model", named.text


def test_deep_nesting_and_bad_encodings_get_their_own_codes(hostile_server: ServerProcess) -> None:
    url = hostile_server.url + "/v1/chat/completions"
    deep = httpx.post(url, content=b"[" * 10000 + b"]" * 10000, headers=JSON, timeout=30)
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "malformed_json", deep.text
    # request bodies come uncompressed: junk, a truncated stream, a real gzip and an unknown coding alike
    for coding, body in [
        ("gzip", b"nope"),
        ("deflate", b"M"),
        ("gzip", gzip.compress(b"{}")),
        ("x-evil", b"{}"),
    ]:
        r = httpx.post(url, content=body, headers={**JSON, "Content-Encoding": coding}, timeout=30)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text


# ---- browsers and the environment ----------------------------------------------------------------------
def _raw(url: str, request: bytes) -> bytes:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_http10_without_a_host_header_is_refused(hostile_server: ServerProcess) -> None:
    answer = _raw(hostile_server.url, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"403", answer[:300]
    assert b"host_not_allowed" in answer
    port = urlsplit(hostile_server.url).port
    ok = _raw(hostile_server.url, f"GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert ok.split(b"\r\n", 1)[0].split()[1] == b"200", ok[:300]


@pytest.mark.parametrize("origin_port", [3000, None])
def test_simple_cross_origin_posts_from_another_port_change_nothing(
    hostile_server: ServerProcess, origin_port: int | None
) -> None:
    """A page on http://localhost:3000 (or the same host without a port) may not make keys or load models."""
    origin = "http://localhost" + (f":{origin_port}" if origin_port else "")
    simple = {"Content-Type": "text/plain", "Origin": origin}
    with httpx.Client(base_url=hostile_server.url, timeout=60) as client:
        before = client.get("/api/keys").json()["keys"]
        r = client.post("/api/keys", content=b'{"name": "evil"}', headers=simple)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
        r = client.post("/api/models/tiny/unload", headers={"Origin": origin})
        assert r.status_code == 403, r.text
        r = client.post("/api/models/tiny/load", headers={"Origin": origin, "Content-Type": "text/plain"})
        assert r.status_code == 403, r.text
        assert client.get("/api/keys").json()["keys"] == before


def test_admin_bodies_must_be_json_even_from_this_machine(hostile_server: ServerProcess) -> None:
    """No Origin (curl, or a browser that leaves it off): a text/plain body is still refused (415)."""
    with httpx.Client(base_url=hostile_server.url, timeout=60) as client:
        before = client.get("/api/keys").json()["keys"]
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = client.post("/api/keys", content=b'{"name": "plain"}', headers={"Content-Type": ctype})
            assert r.status_code == 415, (ctype, r.text)
        assert client.get("/api/keys").json()["keys"] == before
        made = client.post("/api/keys", json={"name": "json-ok"})
        assert made.status_code == 201, made.text


def test_the_servers_own_origin_is_the_same_site(hostile_server: ServerProcess) -> None:
    port = urlsplit(hostile_server.url).port
    with httpx.Client(base_url=hostile_server.url, timeout=60) as client:
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            assert client.get("/api/keys", headers={"Origin": origin}).status_code == 200, origin
        for origin in (f"https://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}", "null"):
            assert client.get("/api/keys", headers={"Origin": origin}).status_code == 403, origin


def test_no_cors_requests_from_another_site_are_refused(hostile_server: ServerProcess) -> None:
    """An <img> or <form> from another site sends no Origin on GET, but browsers say where it came from."""
    for site in ("cross-site", "same-site"):
        r = httpx.get(hostile_server.url + "/api/keys", headers={"Sec-Fetch-Site": site}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
    for site in ("same-origin", "none"):  # the server's own page, or a URL the user typed
        r = httpx.get(hostile_server.url + "/api/keys", headers={"Sec-Fetch-Site": site}, timeout=30)
        assert r.status_code == 200, r.text


def _raised(fn: Callable[[], object]) -> Exception:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an error")


def test_only_errors_raised_while_reading_the_request_become_400s() -> None:
    """The error middleware's safety net is narrow: a ValueError of our own code stays a 500."""
    from app.server.middleware import client_fault

    assert client_fault(_raised(lambda: yarl.URL("http://[::1"))) is not None  # decoding client input
    assert client_fault(_raised(lambda: open("n" * 5000))) is not None  # ENAMETOOLONG: a client's name
    assert client_fault(_raised(lambda: int("x"))) is None  # our own bug
    assert client_fault(_raised(lambda: {}["k"])) is None
    assert client_fault(_raised(lambda: open("/nonexistent/x"))) is None
