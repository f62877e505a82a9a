"""Image checks without an engine: each format's structure, data: URLs, URL fetching behind
`fetch_image_urls` with the private-address rule (a real local HTTP server), and projector pairing."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.core.errors import (
    HubFileNotFoundError,
    ImageFetchError,
    ImageTooLargeError,
    ImageURLRefusedError,
    InvalidImageError,
    UnsupportedImageTypeError,
)
from app.core.settings import Settings
from app.fit.projector import projector_memory
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.hub.selection import RepoCommit, select
from app.hub.transfer import FileSpec
from app.library.pairing import pair_projector, projector_for
from app.server.gateway.image_check import inspect
from app.server.gateway.images import ImagePolicy, prepare_images, private_address
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import (
    BMP_B64,
    GIF_B64,
    JPEG_B64,
    WEBP_B64,
    VisionSpec,
    png_bytes,
    write_tiny_mmproj,
)

PNG = png_bytes(12, 7)


@pytest.mark.parametrize(
    ("data", "mime", "size"),
    [
        (PNG, "image/png", (12, 7)),
        (base64.b64decode(JPEG_B64), "image/jpeg", (8, 8)),
        (base64.b64decode(GIF_B64), "image/gif", (8, 8)),
        (base64.b64decode(WEBP_B64), "image/webp", (8, 8)),
    ],
)
def test_inspect_reads_type_and_size(data: bytes, mime: str, size: tuple[int, int]) -> None:
    info = inspect(data, where="img")
    assert (info.mime, info.width, info.height) == (mime, *size)


@pytest.mark.parametrize(
    "data",
    [
        PNG[:-12],
        PNG[:40],
        base64.b64decode(JPEG_B64)[:400],
        base64.b64decode(GIF_B64)[:120],
        PNG[:30] + b"x" + PNG[31:],
    ],
    ids=["png-no-end", "png-cut", "jpeg-cut", "gif-cut", "png-bad-crc"],
)
def test_truncated_or_corrupt_is_invalid(data: bytes) -> None:
    with pytest.raises(InvalidImageError, match="not a readable image"):
        inspect(data, where="img")


def test_other_files_are_unsupported() -> None:
    with pytest.raises(UnsupportedImageTypeError, match="png, jpeg, gif or webp"):
        inspect(base64.b64decode(BMP_B64), where="img")


def _body(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def _policy(**changes: Any) -> ImagePolicy:
    return ImagePolicy.of(Settings.flat(**changes))


def test_url_fetching_is_off_by_default() -> None:
    with pytest.raises(ImageURLRefusedError, match="fetch_image_urls is off") as e:
        asyncio.run(prepare_images(_body("https://example.com/a.png"), policy=_policy()))
    assert e.value.param == "messages[0].content[1]"


def test_webp_is_reencoded_or_refused_by_name() -> None:
    """The engine reads no WebP: with Pillow it becomes a PNG data URL, without it the 400 says so."""
    body = _body("data:image/webp;base64," + WEBP_B64)
    if importlib.util.find_spec("PIL") is None:
        with pytest.raises(UnsupportedImageTypeError, match="pip install pillow"):
            asyncio.run(prepare_images(body, policy=_policy()))
    else:
        assert asyncio.run(prepare_images(body, policy=_policy())).changed
        assert body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "10.1.2.3", "192.168.0.9", "169.254.169.254", "::1", "::ffff:127.0.0.1"]
)
def test_private_addresses(host: str) -> None:
    assert private_address(host)


def test_public_address() -> None:
    assert not private_address("93.184.216.34")


class _Images:
    def __init__(self, url: str) -> None:
        self.url = url


@pytest.fixture
async def image_server() -> AsyncIterator[_Images]:
    async def png(_r: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def big(_r: web.Request) -> web.Response:
        return web.Response(body=b"\0" * (2 << 20), content_type="image/png")

    async def redirect(_r: web.Request) -> web.Response:
        raise web.HTTPFound("/a.png")

    app = web.Application()
    app.router.add_get("/a.png", png)
    app.router.add_get("/big.png", big)
    app.router.add_get("/go", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield _Images(f"http://127.0.0.1:{port}")
    await runner.cleanup()


async def test_fetch_refuses_private_hosts(image_server: _Images) -> None:
    on = _policy(fetch_image_urls=True)
    with pytest.raises(ImageURLRefusedError, match="private or loopback"):
        await prepare_images(_body(image_server.url + "/a.png"), policy=on)
    by_name = image_server.url.replace("127.0.0.1", "localhost") + "/a.png"  # checked on what it resolves to
    with pytest.raises(ImageURLRefusedError, match="private or loopback"):
        await prepare_images(_body(by_name), policy=on)


async def test_fetch_inlines_the_image(image_server: _Images) -> None:
    allowed = _policy(fetch_image_urls=True, fetch_image_private=True, max_image_mib=1)
    body = _body(image_server.url + "/go")  # a redirect, followed
    seen = await prepare_images(body, policy=allowed)
    assert seen.changed and seen.images[0].width == 12
    url = body["messages"][0]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == PNG
    with pytest.raises(ImageTooLargeError):
        await prepare_images(_body(image_server.url + "/big.png"), policy=allowed)
    with pytest.raises(ImageFetchError, match="HTTP 404"):
        await prepare_images(_body(image_server.url + "/nothing.png"), policy=allowed)


# ---- pairing -------------------------------------------------------------------------------------
def test_pairing_by_width(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf")
    write_tiny_mmproj(tmp_path / "mmproj-other-f16.gguf", VisionSpec(projection_dim=32))
    assert pair_projector(model, embedding_length=64) is None  # another model's projector
    right = write_tiny_mmproj(tmp_path / "mmproj-m-f16.gguf")
    assert pair_projector(model, embedding_length=64) == right
    snap = tmp_path / "snap"
    deep = write_tiny_mmproj(snap / "vision" / "mmproj-x.gguf")
    assert pair_projector(snap / "q4" / "m.gguf", embedding_length=64, snapshot=snap) == deep
    assert projector_for(model, right, override="none") is None
    assert projector_for(model, right, override="elsewhere.gguf") == tmp_path / "elsewhere.gguf"


def test_projector_memory(tmp_path: Path) -> None:
    layout = read_gguf_layout(write_tiny_mmproj(tmp_path / "mmproj.gguf"))
    assert isinstance(layout, GGUFLayout)
    pm = projector_memory(layout)
    assert pm.weights == layout.tensor_bytes > 100_000
    assert pm.image_tokens == 16 and 0 < pm.compute < 1 << 20


# ---- pull: the projector beside the quantization -----------------------------------------------------
def _repo(*paths: str) -> RepoCommit:
    return RepoCommit("org/vl", "a" * 40, {p: FileSpec(p, 100 + i, f"{i:064x}") for i, p in enumerate(paths)})


def test_pull_takes_the_f16_projector_unless_told() -> None:
    rc = _repo("vl-Q4_K_M.gguf", "vl-Q8_0.gguf", "mmproj-vl-Q8_0.gguf", "mmproj-vl-f16.gguf")
    assert [f.path for f in select(rc, "Q8_0")] == ["vl-Q8_0.gguf", "mmproj-vl-f16.gguf"]
    assert [f.path for f in select(rc, "Q4_K_M", mmproj="mmproj-vl-Q8_0.gguf")][-1] == "mmproj-vl-Q8_0.gguf"
    assert [f.path for f in select(rc, "Q4_K_M", mmproj="none")] == ["vl-Q4_K_M.gguf"]
    with pytest.raises(
        HubFileNotFoundError, match=r"its projectors: mmproj-vl-Q8_0\.gguf, mmproj-vl-f16\.gguf"
    ):
        select(rc, "Q4_K_M", mmproj="mmproj-other.gguf")
