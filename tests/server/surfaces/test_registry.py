"""The API surfaces' registry (app/server/surfaces/registry.py) checked against the packages on disk, and the
front door each surface owns: its routes and schemas, its policy group, its key and CORS headers, its
error shape, and which of its routes the admin gate covers. The seams around them are folder rules."""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from app.core.errors import KeyRequiredError
from app.core.paths import Paths
from app.core.policy import GROUPS
from app.core.secrets import KeyStore
from app.core.settings import Settings
from app.runtime import Runtime
from app.server import auth, middleware
from app.server.app import make_app
from app.server.openapi import components, document
from app.server.request_keys import CLIENT
from app.server.surfaces.base import OPENAI, Routes, Surface, handler_surface
from app.server.surfaces.registry import SURFACES

REPO = Path(__file__).resolve().parents[3]
DEPLOYMENTS: web.AppKey[tuple[str, ...]] = web.AppKey("deployments", tuple)
SURFACES_DIR = REPO / "app" / "server" / "surfaces"


# ---- the registry against the disk ----------------------------------------------------------------
def test_every_surface_package_on_disk_is_registered_once() -> None:
    on_disk = {p.name for p in SURFACES_DIR.iterdir() if (p / "__init__.py").exists()}
    names = [s.name for s in SURFACES]
    assert sorted(names) == sorted(on_disk), "add the package's SURFACE to SURFACES (surfaces/registry.py)"
    for surface in SURFACES:
        module = importlib.import_module(f"app.server.surfaces.{surface.name}.surface")
        assert module.SURFACE is surface


def test_the_safety_policy_groups_are_the_surfaces() -> None:
    """app/core may not import the server, so core/policy.GROUPS is kept by hand: this keeps it true."""
    assert sorted(GROUPS) == sorted(s.group for s in SURFACES)


def test_each_surface_has_routes_schemas_and_documented_operations(tmp_path: Path) -> None:
    app = make_app(Runtime(settings=Settings(), paths=Paths(home=tmp_path / "home")))
    doc = document(app)
    for surface in SURFACES:
        served = {
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.resource is not None
            and r.method != "HEAD"
            and (found := handler_surface(r.handler)) is not None
            and found[0] is surface
        }
        assert served, f"{surface.name} installed no route"
        assert surface.schemas and surface.operations, surface.name
        assert set(surface.operations) <= served, f"{surface.name} documents routes it does not serve"
        for method, path in served:
            op = doc["paths"][path][method.lower()]
            error = op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"]
            assert error.endswith("/" + surface.encoding.error_schema), (method, path)
            assert op["tags"] in ([surface.tag], *([r.tag] for r in surface.routes if r.tag)), (method, path)
        for name in json.dumps(list(surface.operations.values())).split("#/components/schemas/")[1:]:
            assert name.split('"')[0] in doc["components"]["schemas"]


def test_no_route_is_tagged_by_its_file_name(tmp_path: Path) -> None:
    """Tags come from the surfaces and from each route module's TAG (before: 'routes', 'jobs', 'bank')."""
    app = make_app(Runtime(settings=Settings(), paths=Paths(home=tmp_path / "home")))
    tags = {op["tags"][0] for ops in document(app)["paths"].values() for op in ops.values()}
    assert all(t[0].isupper() for t in tags), tags


async def _no_tag(request: web.Request) -> web.Response:
    return web.json_response({})


def test_a_route_of_no_surface_and_no_module_tag_is_refused_by_the_document() -> None:
    app = web.Application()
    app.router.add_get("/api/untagged", _no_tag)
    with pytest.raises(TypeError, match="declares no TAG"):
        document(app)


def test_two_surfaces_cannot_define_the_same_schema() -> None:
    openai = SURFACES[0]
    twin = Surface(name="twin", tag="Twin", encoding=OPENAI, routes=(), schemas=openai.schemas, operations={})
    with pytest.raises(ValueError, match="defined already"):
        components((openai, twin))


# ---- the front door: keys, refusals, CORS, the admin gate -------------------------------------------
def _front_door(home: Path, *surfaces: Surface, **settings: Any) -> web.Application:
    """The real key and CORS middlewares and error shapes in front of `surfaces`' real routes."""
    app = web.Application(middlewares=[middleware.errors, auth.cors_preflight, auth.require_key])
    auth.setup(app, Settings.flat(**settings), Paths(home=home), surfaces=surfaces)
    for surface in surfaces:
        surface.install(app)
    return app


@pytest.fixture
async def locked(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    app = _front_door(tmp_path / "home", *SURFACES, require_api_key=True)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_a_missing_key_is_refused_in_the_shape_of_the_routes_surface(
    locked: TestClient[Any, Any],
) -> None:
    r = await locked.post("/v1/messages", json={})
    assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    body = await r.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    r = await locked.post("/api/chat", json={})
    assert r.status == 401 and set(await r.json()) == {"error"}
    r = await locked.post("/v1/responses", json={})
    assert r.status == 401 and (await r.json())["error"]["code"] == KeyRequiredError.code
    r = await locked.get("/api/settings")  # a route of no surface: OpenAI's envelope
    assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"


async def test_a_preflight_allows_each_surfaces_own_headers(tmp_path: Path) -> None:
    origin = "http://app.example"
    app = _front_door(tmp_path / "home", *SURFACES, cors_origins=(origin,))
    async with TestClient(TestServer(app)) as client:
        r = await client.options(
            "/v1/messages", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        allowed = [h.strip() for h in r.headers["Access-Control-Allow-Headers"].split(",")]
    assert r.status == 204
    assert allowed == ["Authorization", "x-api-key", "Content-Type", "anthropic-version", "anthropic-beta"]


async def test_a_surface_reads_keys_from_the_headers_it_names(tmp_path: Path) -> None:
    """A surface whose clients send `api-key: KEY` (Azure's style) gets it read, and only there."""
    home = tmp_path / "home"
    key = KeyStore.at(Paths(home=home)).create("editor").secret.reveal()
    table = web.RouteTableDef()

    @table.post("/azure/chat")
    async def chat(request: web.Request) -> web.Response:
        return web.json_response({"client": request[CLIENT]})

    azure = Surface(
        name="azure",
        tag="Azure",
        encoding=OPENAI,
        routes=(Routes(table),),
        schemas={},
        operations={},
        key_headers=("api-key",),
        setup=lambda app: app.__setitem__(DEPLOYMENTS, ("gpt-local",)),
    )
    app = _front_door(home, azure, require_api_key=True)
    assert app[DEPLOYMENTS] == ("gpt-local",)  # its setup hook ran as it was installed
    async with TestClient(TestServer(app)) as client:
        ok = await client.post("/azure/chat", headers={"api-key": key})
        assert ok.status == 200 and (await ok.json()) == {"client": "editor"}
        other = await client.post("/azure/chat", headers={"x-api-key": key})
        assert other.status == 401  # not a header this surface's clients send keys in


async def test_the_admin_gate_covers_admin_routes_and_ollamas_management_only(tmp_path: Path) -> None:
    app = make_app(Runtime(settings=Settings(), paths=Paths(home=tmp_path / "home")))

    async def admin(method: str, path: str) -> bool:
        request = make_mocked_request(method, path, app=app)
        match = await app.router.resolve(request)
        request._match_info = match  # what aiohttp sets before the middlewares run
        return auth.is_admin(request)

    for method, path in [("POST", "/api/pull"), ("DELETE", "/api/delete"), ("GET", "/api/settings")]:
        assert await admin(method, path), path
    for method, path in [("POST", "/api/chat"), ("GET", "/api/tags"), ("GET", "/api/version")]:
        assert not await admin(method, path), path
    assert not await admin("POST", "/v1/chat/completions")
    assert await admin("GET", "/api/no-such-route")  # unmatched under /api/: the gate applies


# ---- seams as folder rules ----------------------------------------------------------------------------
def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_the_gateway_asks_targets_and_never_which_class_they_are() -> None:
    """Target members (app/lanes/target.py) answer what `isinstance(target, Lane | RemoteLane)` did."""
    bad = []
    for f in sorted((REPO / "app" / "server" / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                classes = ast.unparse(node.args[1])
                if "Lane" in classes:
                    bad.append(f"{f.relative_to(REPO)}:{node.lineno}: isinstance(..., {classes})")
    assert not bad, bad


def test_no_route_module_names_its_surface() -> None:
    """A surface's routes are marked when SURFACES installs them: a route module importing a Surface
    object or marking handlers itself would keep a second list."""
    bad = [
        f"{f.relative_to(REPO)}: {name}"
        for f in sorted(SURFACES_DIR.rglob("*.py"))
        if f.name not in ("surface.py", "registry.py")
        for name in _imports(f)
        if name.endswith(".surface") or name == "app.server.surfaces.registry"
    ]
    assert not bad, bad
