"""GET /ui and /docs with their static files, under a strict Content-Security-Policy.

The files hold no data and no secret, so they load without a key (a browser cannot send one on a
navigation); everything they show comes from the admin API, which asks for the key and refuses other
origins as it does for any client. Only names in the package's own folders are served (no path from the
request reaches the file system), with their content types fixed here.
"""

from __future__ import annotations

from collections.abc import Collection
from importlib import resources
from importlib.resources.abc import Traversable

from aiohttp import web

# no inline script or style, nothing from another origin, never framed: what the pages may do
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# the dashboard's own files, and the Swagger UI files the docs page loads (vendored: static/swagger/)
UI_FILES = frozenset({"index.html", "dashboard.js", "dashboard.css", "chart.js", "api.js"})
DOCS_FILES = frozenset({"docs.html", "docs.js", "swagger-ui-bundle.js", "swagger-ui.css"})
PAGE_ROUTES = ("/", "/ui", "/docs")


def _static() -> Traversable:
    return resources.files(__package__) / "static"


def _file(name: str) -> web.Response:
    folder = _static() / "swagger" if name.startswith("swagger-ui") else _static()
    data = (folder / name).read_bytes()
    suffix = name[name.rfind(".") :]
    return web.Response(body=data, headers={**HEADERS, "Content-Type": _TYPES[suffix]})


# what `/` answers a client that is not a browser: where things are (a liveness probe's HEAD / gets 200)
ROOT = {"name": "switchyard", "status": "running", "api": "/v1", "ui": "/ui", "docs": "/docs"}


async def root(request: web.Request) -> web.Response:
    """Where this server's API, dashboard and docs are; a browser is sent on to the dashboard"""
    if "text/html" in request.headers.get("Accept", ""):
        raise web.HTTPFound("/ui", headers=HEADERS)
    return web.json_response(ROOT, headers=HEADERS)


def _listed(request: web.Request, files: Collection[str], *, missing: str) -> web.Response:
    """The file the route's `name` names, when it is one of `files` (nothing else in the folder is served);
    else a 404 that says `missing` (formatted with the name)."""
    name = request.match_info["name"]
    if name not in files:
        raise web.HTTPNotFound(text=missing.format(name))
    return _file(name)


async def ui_page(request: web.Request) -> web.Response:
    """The web dashboard (an HTML page; it asks for the API key where the server needs one)"""
    return _file("index.html")


async def ui_file(request: web.Request) -> web.Response:
    """One of the dashboard's script and style files"""
    return _listed(request, UI_FILES, missing="no dashboard file {!r}; the dashboard is at /ui")


async def docs_page(request: web.Request) -> web.Response:
    """This API document, browsable (Swagger UI, served by this server)"""
    return _file("docs.html")


async def docs_file(request: web.Request) -> web.Response:
    """One of the API page's files (Swagger UI's script and style)"""
    return _listed(request, DOCS_FILES, missing="no docs file {!r}; the API document is at /docs")


TAG = "Dashboard"  # the OpenAPI tag of its routes


def setup(app: web.Application) -> None:
    """Add the dashboard's routes to `app` (one line in the app factory)."""
    app.router.add_get("/", root)
    app.router.add_get("/ui", ui_page)
    app.router.add_get("/ui/{name}", ui_file)
    app.router.add_get("/docs", docs_page)
    app.router.add_get("/docs/{name}", docs_file)


def is_page_path(path: str) -> bool:
    """Whether `path` is one of the dashboard's static files (served without a key: they hold no data)."""
    return path in PAGE_ROUTES or path.startswith(("/ui/", "/docs/"))
