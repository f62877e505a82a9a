"""Hostile requests for the input-hardening tests: bodies, query strings and path values that once
produced 500s, and a real `switchyard serve` to aim them at (every route listed in its /openapi.json)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, link_models, running_server

JSON = {"Content-Type": "application/json"}
# every field some route reads, with a value that route accepts: hostile variants replace one at a time
BASE: dict[str, Any] = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "prompt": "hi",
    "input": "hi",
    "text": "hi",
    "query": "q",
    "documents": ["a"],
    "max_tokens": 1,
    "num_predict": 1,
    "options": {"num_predict": 1},
    "name": "fuzz",
    "path": "/nonexistent/x.gguf",
    "repo": "org/none",
    "source": "tiny",
    "destination": "copy-of-tiny",
    "version": "0.0.1",
}
BIG = 2**70
# engines (and an SSE route) that the corpus must not start or follow for ever
SKIP = re.compile(r"/events$")


@dataclass(frozen=True)
class Case:
    """One hostile request body: what it is, its bytes and the headers that go with it."""

    label: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def _form(label: str, disposition: str, data: bytes) -> Case:
    """A multipart body of one part with these Content-Disposition parameters (and headers after)."""
    part = f"--x\r\nContent-Disposition: form-data; {disposition}\r\n\r\n".encode() + data
    return Case(label, part + b"\r\n--x--\r\n", {"Content-Type": "multipart/form-data; boundary=x"})


def _with(name: str, value: Any) -> bytes:
    return _dump({**BASE, name: value})


def body_cases() -> list[Case]:
    """The corpus: malformed JSON, hostile values in each field, and hostile encodings and types."""
    deep = b"[" * 10000 + b"]" * 10000
    cases = [
        Case("empty", b""),
        Case("blank", b"   "),
        Case("not json", b"{nope"),
        Case("array", b"[]"),
        Case("null", b"null"),
        Case("number", b"1"),
        Case("string", b'"x"'),
        Case("deep array", deep),
        Case("deep object", b'{"a":' * 10000 + b"1" + b"}" * 10000),
        Case("deep field", _dump({**BASE})[:-1] + b', "extra": ' + deep + b"}"),
        Case("invalid utf-8", b'{"model": "\xff\xfe", "name": "\xc3("}'),
        Case("lone surrogate", b'{"model": "\\ud800", "name": "\\udfff", "path": "\\ud800"}'),
        Case("NaN", b'{"model": "tiny", "temperature": NaN, "max_tokens": NaN}'),
        Case("Infinity", b'{"model": "tiny", "temperature": Infinity, "top_p": -Infinity}'),
        Case("float overflow", b'{"model": "tiny", "temperature": 1e400, "max_tokens": 1e400}'),
        Case("duplicate keys", b'{"model": "tiny", "model": 3}'),
        Case("gzip junk", b"this is not gzip", {**JSON, "Content-Encoding": "gzip"}),
        Case("deflate junk", b"this is not deflate", {**JSON, "Content-Encoding": "deflate"}),
        Case("br junk", b"this is not brotli", {**JSON, "Content-Encoding": "br"}),
        Case("unknown encoding", _dump(BASE), {**JSON, "Content-Encoding": "x-evil"}),
        Case("gzip bomb-ish", gzip.compress(b"[" * 200000), {**JSON, "Content-Encoding": "gzip"}),
        Case("text/plain", _dump(BASE), {"Content-Type": "text/plain"}),
        Case("form", _dump(BASE), {"Content-Type": "application/x-www-form-urlencoded"}),
        Case("multipart junk", b"--x\r\nnot a part", {"Content-Type": "multipart/form-data; boundary=x"}),
        Case("multipart no boundary", b"junk", {"Content-Type": "multipart/form-data"}),
        _form("multipart bad charset", 'name="model"\r\nContent-Type: text/plain; charset=x-nope', b"tiny"),
        _form("multipart long filename", f'name="file"; filename="{"f" * 5000}.wav"', b"RIFF"),
        _form("multipart bad base64", 'name="model"\r\nContent-Transfer-Encoding: base64', b"!!*"),
        _form("multipart NUL name", 'name="mo\x00del"', b"tiny"),
        Case("bad charset", _dump(BASE), {"Content-Type": "application/json; charset=x-nope"}),
        Case("NUL bytes", b'{"model": "ti\\u0000ny", "name": "a\\u0000b", "path": "/tmp/a\\u0000b"}'),
        Case("raw NUL", b"\x00" * 64),
    ]
    hostile: list[tuple[str, Any]] = [
        ("huge int", BIG),
        ("huge negative int", -BIG),
        ("int over int64", 2**63),
        ("long string", "a" * 70000),
        ("long name", "n" * 5000),
        ("array", ["x"]),
        ("object", {"x": 1}),
        ("bool", True),
        ("float", 1.5),
        ("negative", -1),
        ("NUL", "a\x00b"),
        ("path traversal", "../../../../etc/passwd"),
        ("non-ascii digits", "٣٣"),
    ]
    for label, value in hostile:  # every field at once: the first one a route reads must be refused
        cases.append(Case(f"all fields: {label}", _dump(dict.fromkeys(BASE, value))))
    for name in BASE:  # one field at a time, in an otherwise valid body
        for label, value in hostile[:3] + hostile[4:5] + hostile[10:11]:
            cases.append(Case(f"{name}: {label}", _with(name, value)))
    options = {"num_ctx": BIG, "seed": BIG, "num_predict": BIG, "temperature": 1e308}
    cases.append(Case("options: huge ints", _with("options", options)))
    cases.append(Case("messages: huge content int", _with("messages", [{"role": "user", "content": BIG}])))
    return cases


# values for query parameters and path segments: non-ASCII digits, huge numbers, junk
QUERY_VALUES = ["٣", "²", "१०", "9" * 40, "-1", "1e9", "0x10", "", "true\x00", "a" * 5000, "nan", "∞"]
QUERY_NAMES = ["lines", "limit", "page", "verify", "delete_files", "id", "q", "revision", "quant", "sort"]
PATH_VALUES = ["nosuch", "n" * 3000, "٣", "..%2F..%2Fetc", "%00", "a%ff"]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    has_body: bool

    def paths(self) -> Iterator[str]:
        """The route with every path parameter set to each hostile path value in turn."""
        if "{" not in self.template:
            yield self.template
            return
        for value in PATH_VALUES:
            yield re.sub(r"\{[^}]+\}", value, self.template)


def routes_of(url: str) -> list[Route]:
    """Every operation in the server's own /openapi.json."""
    doc = httpx.get(url + "/openapi.json", timeout=30).json()
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if not SKIP.search(path):
                out.append(Route(method.upper(), path, "requestBody" in op or method != "get"))
    return out


def acceptable(r: httpx.Response) -> bool:
    """Any 4xx; a 502-504 only when it says which part is unavailable (the hub offline, an engine that
    cannot start), never a gateway's internal error, a 500, or a dropped connection."""
    if r.status_code < 500:
        return True
    return r.status_code in (502, 503, 504) and "internal" not in r.text


def live(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    """A real `serve` with the tiny chat model, offline (HF), with a keyring that cannot reach the user's."""
    base = tmp_path_factory.mktemp("harden")
    models = link_models(base / "models", model_store / "tiny.gguf")
    with pytest.MonkeyPatch.context() as mp:  # module fixtures run before the autouse isolation
        mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(base / "hf"))
        mp.setenv("HF_HUB_CACHE", str(base / "hf" / "hub"))
        mp.delenv("SWITCHYARD_API_KEY", raising=False)
        (base / "home").mkdir()
        (base / "home" / "settings.json").write_text(json.dumps({"offline": True}))
        with running_server(base / "home", models, "--parallel", "1") as s:
            yield s
