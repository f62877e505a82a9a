"""/ui and /docs without a browser: the security headers, only the package's own files, no inline script
or style in the pages (the CSP would block it), the page open and the data closed without a key, and
state changes from another origin refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html.parser import HTMLParser
from importlib import resources

import httpx
import pytest

from app.server.dashboard.routes import CSP, DOCS_FILES, UI_FILES
from tests.conftest import ServerProcess, running_server
from tests.support.tinymodels import CHAT, write_tiny_gguf

STATIC = resources.files("app.server.dashboard") / "static"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("dash-home")
    (home / "settings.json").write_text(json.dumps({"require_api_key": True}))
    models = tmp_path_factory.mktemp("dash-models")
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    with running_server(home, models) as s:
        yield s


def test_pages_and_files_carry_the_security_headers(server: ServerProcess) -> None:
    for path, kind in [
        ("/ui", "text/html"),
        ("/ui/dashboard.js", "text/javascript"),
        ("/ui/dashboard.css", "text/css"),
        ("/docs", "text/html"),
        ("/docs/swagger-ui-bundle.js", "text/javascript"),
        ("/docs/swagger-ui.css", "text/css"),
    ]:
        r = httpx.get(server.url + path)  # no key: the files hold no data
        assert r.status_code == 200, (path, r.text[:200])
        assert r.headers["Content-Type"].startswith(kind), path
        assert r.headers["Content-Security-Policy"] == CSP
        assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src 'self';" in CSP and "unsafe" not in CSP and "frame-ancestors 'none'" in CSP


@pytest.mark.parametrize(
    "path", ["/ui/index.py", "/ui/..%2froutes.py", "/ui/swagger-ui-bundle.js", "/docs/dashboard.js", "/ui/x"]
)
def test_only_the_listed_files_are_served(server: ServerProcess, path: str) -> None:
    assert httpx.get(server.url + path).status_code == 404


def test_the_data_needs_the_key_and_changes_need_this_origin(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/api/library").status_code == 401
    assert httpx.get(server.url + "/openapi.json").status_code == 401
    foreign = httpx.post(
        server.url + "/api/models/tiny/load",
        headers={"Origin": "http://evil.example", "Content-Type": "application/json"},
        content=b"{}",
    )
    assert foreign.status_code == 403, foreign.text


class _Audit(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and not names.get("src"):
            self.problems.append("an inline <script>")
        if tag == "style":
            self.problems.append("an inline <style>")
        for name, _ in attrs:
            if name == "style" or name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...>")
        for name in ("src", "href"):
            value = names.get(name) or ""
            if "://" in value or value.startswith("//"):
                self.problems.append(f"<{tag} {name}={value}> from elsewhere")


@pytest.mark.parametrize("page", ["index.html", "docs.html"])
def test_pages_hold_nothing_the_csp_would_block(page: str) -> None:
    audit = _Audit()
    audit.feed((STATIC / page).read_text())
    assert audit.problems == []


def test_every_listed_file_exists_and_scripts_never_write_html() -> None:
    for name in UI_FILES | DOCS_FILES:
        folder = STATIC / "swagger" if name.startswith("swagger-ui") else STATIC
        assert (folder / name).is_file(), name
    for name in ("dashboard.js", "api.js", "chart.js", "docs.js"):
        text = (STATIC / name).read_text()
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "eval(" not in text, name
    # the key never goes into a URL or a persistent store
    api = (STATIC / "api.js").read_text()
    assert "sessionStorage" in api and "localStorage" not in api and "document.cookie" not in api
    assert "Apache License" in (STATIC / "swagger" / "LICENSE").read_text()
