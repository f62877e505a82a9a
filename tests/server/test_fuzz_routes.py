"""Property-based fuzzing of every route in the server's own /openapi.json (hypothesis): whatever the path
values, query string, headers and body, the answer is never a 500 and the server keeps answering."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tests.conftest import ServerProcess
from tests.support.harden_corpus import BASE, QUERY_NAMES, Route, acceptable, hostile_server, live, routes_of

__all__ = ["hostile_server"]  # the module-scoped server fixture

EDGE_INTS = [2**31, 2**53 + 1, 2**63, -(2**63) - 1, 2**64, 10**30]
EDGE_TEXT = ["\ud800", "\x00", "٣", "²", "../..", "a" * 3000, "tiny", "", " ", "%00", "\u202e"]
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGE_INTS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(EDGE_TEXT)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(list(BASE)) | st.text(max_size=10)
CONTENT_TYPES = [  # JSON most often, so that most bodies get past the headers to the routes' own reading
    *["application/json"] * 8,
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/json; charset=latin-1",
    "multipart/form-data; boundary=x",
    "application/vnd.api+json",
]
ENCODINGS = [*[None] * 12, "gzip", "deflate", "br", "identity", "x-evil", "gzip, deflate"]


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A plausible body with a few fields replaced, or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64))
    doc: Any = {k: v for k, v in BASE.items() if draw(st.booleans())}
    doc.update(draw(st.dictionaries(keys, values, max_size=5)))
    if draw(st.integers(0, 9)) == 0:
        doc = draw(values)  # not an object at all
    text = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans()))
    return text.encode("utf-8", errors="surrogatepass")


@st.composite
def requests(draw: st.DrawFn, routes: list[Route]) -> tuple[str, str, dict[str, str], bytes | None]:
    route = draw(st.sampled_from(routes))
    path = route.template
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        value = draw(st.text(min_size=1, max_size=30) | st.sampled_from([*EDGE_TEXT[:-3], "nosuch"]))
        raw = value.encode("utf-8", errors="surrogatepass")
        path = path[:start] + quote(raw, safe="") + path[end + 1 :]
    query = draw(st.dictionaries(st.sampled_from(QUERY_NAMES), st.text(max_size=12), max_size=3))
    if query:
        path += "?" + urlencode(query)
    headers: dict[str, str] = {}
    ctype, encoding = draw(st.sampled_from(CONTENT_TYPES)), draw(st.sampled_from(ENCODINGS))
    if ctype:
        headers["Content-Type"] = ctype
    if encoding:
        headers["Content-Encoding"] = encoding
    body = draw(bodies()) if route.has_body and route.method != "GET" else None
    return route.method, path, headers, body


def fuzz(server: ServerProcess, examples: int) -> None:
    routes = routes_of(server.url)
    client = httpx.Client(base_url=server.url, timeout=120)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(requests(routes))
    def one(req: tuple[str, str, dict[str, str], bytes | None]) -> None:
        method, path, headers, body = req
        note(f"{method} {path} {headers} {body!r:.300}")
        try:
            r = client.request(method, path, headers=headers, content=body)
        except httpx.TransportError as exc:
            r = httpx.Response(599, text=f"no answer: {exc!r}")
        assert acceptable(r), f"{r.status_code} {r.text[:400]}"

    with client:
        one()
    assert live(server.url)


def test_fuzz_every_route_from_openapi(hostile_server: ServerProcess) -> None:
    fuzz(hostile_server, 300)


@pytest.mark.slow
def test_fuzz_every_route_from_openapi_at_length(hostile_server: ServerProcess) -> None:
    fuzz(hostile_server, 3000)
