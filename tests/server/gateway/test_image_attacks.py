"""Images attacked on purpose (issue 33): a redirect to a private address in any spelling is refused on
every hop, fetched bytes are never quoted back, a body sent in several writes is read whole, and a small
file that declares a huge picture (PNG, GIF screen or frame, a second JPEG frame, many images in one
request) is refused from its headers before anything is inflated, with decoding kept off the event loop.

The redirect tests run inside a network namespace of their own (`unshare -rn`), where a global address
(93.184.216.34) is put on the loopback device: a real "public" server redirects to real private services,
and nothing outside the namespace is touched."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.core.errors import ImageTooLargeError, InvalidImageError, UnsupportedImageTypeError
from app.core.settings import Settings
from app.server.gateway.image_check import inspect
from app.server.gateway.images import ImagePolicy, prepare_images, private_address

ROOT = Path(__file__).resolve().parents[3]
while not (ROOT / "pyproject.toml").exists():  # the same file whether it sits in tests/ or a sub-folder
    ROOT = ROOT.parent


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, *, idat: bytes | None = None) -> bytes:
    """An RGBA PNG of zero pixels (compressed in row steps, so a large one is cheap to make)."""
    if idat is None:
        packer, row = zlib.compressobj(1), b"\0" * (1 + 4 * width)
        idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def gif(width: int, height: int, frames: list[tuple[int, int, int, int]] | None = None) -> bytes:
    """A GIF with no colour tables whose frames (left, top, width, height) hold one tiny LZW block each."""
    out = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
    for left, top, w, h in frames or [(0, 0, 1, 1)]:
        out += b"\x2c" + struct.pack("<HHHHB", left, top, w, h, 0) + b"\x02\x02\x4c\x01\x00"
    return out + b"\x3b"


def jpeg_frames(*sizes: tuple[int, int]) -> bytes:
    """A JPEG skeleton with one baseline frame header per size, then a scan and the end marker."""
    out = b"\xff\xd8"
    for w, h in sizes:
        out += b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, h, w, 1) + b"\x01\x11\x00"
    return out + b"\xff\xda" + struct.pack(">H", 8) + b"\x01\x01\x00\x00\x3f\x00" + b"\x00" * 8 + b"\xff\xd9"


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _body(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def _policy(**changes: Any) -> ImagePolicy:
    return ImagePolicy.of(Settings.flat(**changes))


# --- decompression bombs: refused from what the headers declare --------------------------------------


def test_a_png_declaring_a_huge_picture_is_refused_before_inflating() -> None:
    bomb = png(16384, 16384, idat=zlib.compress(b"\0" * 4096))  # 268 megapixels declared in 4 KB
    with pytest.raises(ImageTooLargeError, match="max_image_megapixels") as e:
        inspect(bomb, where="img", max_pixels=40_000_000)
    assert e.value.status == 413 and "16384x16384" in str(e.value)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (gif(8192, 8192), "logical screen"),  # 43 bytes: a decoder allocates the whole screen
        (jpeg_frames((8, 8), (16000, 16000)), "16000x16000"),  # the second frame header, not only the first
    ],
    ids=["gif-screen", "jpeg-second-frame"],
)
def test_every_declared_size_is_within_the_budget(data: bytes, what: str) -> None:
    with pytest.raises(ImageTooLargeError, match="max_image_megapixels") as e:
        inspect(data, where="img", max_pixels=40_000_000)
    assert what in str(e.value)


def test_a_gif_frame_outside_its_screen_is_invalid() -> None:
    with pytest.raises(InvalidImageError, match="frame 2 lies outside"):
        inspect(gif(8, 8, [(0, 0, 8, 8), (4, 4, 8, 8)]), where="img")
    assert inspect(gif(8, 8, [(0, 0, 8, 8), (4, 4, 4, 4)]), where="img").width == 8


async def test_the_pixels_of_a_whole_request_are_bounded() -> None:
    three = _body(*[_data_url(gif(6000, 6000), "image/gif")] * 3)  # 36 MP each, under the 40 MP per image
    with pytest.raises(ImageTooLargeError, match="max_request_megapixels") as e:
        await prepare_images(three, policy=_policy())
    assert e.value.param == "messages[0].content[3]"  # the third one passes the 80 MP budget
    seen = await prepare_images(_body(*[_data_url(gif(6000, 6000), "image/gif")] * 2), policy=_policy())
    assert seen.count == 2


@pytest.fixture(scope="module")
def big_png() -> bytes:
    return png(6000, 6000)  # 36 MP: within the budget, 144 MB once inflated, 140 KB as a file


def test_a_png_is_inflated_in_bounded_steps(big_png: bytes) -> None:
    tracemalloc.start()
    try:
        assert inspect(big_png, where="img", max_pixels=40_000_000).height == 6000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"checking a 140 KB PNG held {peak >> 20} MiB at once"


async def test_decoding_runs_off_the_event_loop(big_png: bytes) -> None:
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    started = time.perf_counter()
    await prepare_images(_body(_data_url(big_png), _data_url(big_png)), policy=_policy())
    took = time.perf_counter() - started
    done.set()
    await tick
    # inflating 2 x 144 MB takes about a second here; on the loop, one gap would be that long
    assert max(gaps) < max(0.25, took / 3), f"the loop stalled {max(gaps):.2f} s of a {took:.2f} s check"


# --- fetching: the whole body, and never an echo ---------------------------------------------------------

SECRET = b"root:x:0:0:SECRET-TOKEN-42\n"


@pytest.fixture
async def local_server() -> AsyncIterator[str]:
    picture = png(300, 300)

    async def in_two_writes(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        await resp.prepare(request)
        await resp.write(picture[: len(picture) // 2])
        await asyncio.sleep(0.2)
        await resp.write(picture[len(picture) // 2 :])
        await resp.write_eof()
        return resp

    async def private_text(_r: web.Request) -> web.Response:
        return web.Response(body=SECRET, content_type="image/png")

    app = web.Application()
    app.router.add_get("/slow.png", in_two_writes)
    app.router.add_get("/passwd", private_text)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


async def test_a_body_in_several_writes_is_read_whole(local_server: str) -> None:
    seen = await prepare_images(
        _body(local_server + "/slow.png"), policy=_policy(fetch_image_urls=True, fetch_image_private=True)
    )
    assert seen.images[0].width == 300


async def test_fetched_bytes_are_never_quoted(local_server: str) -> None:
    with pytest.raises(UnsupportedImageTypeError) as e:
        await prepare_images(
            _body(local_server + "/passwd"), policy=_policy(fetch_image_urls=True, fetch_image_private=True)
        )
    assert "root" not in str(e.value) and "SECRET" not in str(e.value)


# --- SSRF through redirects, inside a network namespace ------------------------------------------------

PUBLIC = "93.184.216.34"
_SCRIPT = r"""
import asyncio, json, sys
from urllib.parse import urlencode
from aiohttp import web
from app.core.errors import SwitchyardError
from app.core.settings import Settings
from app.server.gateway.images import ImagePolicy, prepare_images

PUBLIC, PICTURE, SECRET = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3].encode()

async def serve(app, host):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1]

async def main():
    private = web.Application()
    private.router.add_get("/secret", lambda r: web.Response(body=SECRET, content_type="image/png"))
    private.router.add_get("/picture", lambda r: web.Response(body=PICTURE, content_type="image/png"))
    p = await serve(private, "127.0.0.1")
    public = web.Application()
    async def hop(r):
        raise web.HTTPFound(r.query["to"])
    public.router.add_get("/hop", hop)
    public.router.add_get("/a.png", lambda r: web.Response(body=PICTURE, content_type="image/png"))
    q = await serve(public, PUBLIC)
    base = f"http://{PUBLIC}:{q}"
    def via(to):
        return f"{base}/hop?" + urlencode({"to": to})
    targets = {
        "public-direct": f"{base}/a.png",
        "public-redirect": via("/a.png"),
        "literal": via(f"http://127.0.0.1:{p}/secret"),
        "literal-image": via(f"http://127.0.0.1:{p}/picture"),
        "short-form": via(f"http://127.1:{p}/secret"),
        "decimal": via(f"http://2130706433:{p}/secret"),
        "trailing-dot": via(f"http://127.0.0.1.:{p}/secret"),
        "hex-name": via(f"http://0x7f000001:{p}/secret"),
        "mapped-v6": via(f"http://[::ffff:127.0.0.1]:{p}/secret"),
        "mapped-v6-hex": via(f"http://[::ffff:7f00:1]:{p}/secret"),
        "name": via(f"http://localhost:{p}/secret"),
        "two-hops": via(via(f"http://127.0.0.1:{p}/secret")),
        "metadata": via("http://169.254.169.254/latest/meta-data/"),
    }
    policy = ImagePolicy.of(Settings.flat(fetch_image_urls=True, fetch_image_timeout_s=3))
    out = {}
    for name, url in targets.items():
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
        try:
            await prepare_images(body, policy=policy)
            out[name] = "fetched"
        except SwitchyardError as exc:
            out[name] = f"{exc.code}: {exc}"
    print(json.dumps(out))

asyncio.run(main())
"""


def _namespace_argv() -> list[str]:
    if not (shutil.which("unshare") and shutil.which("ip")):
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a private network namespace")
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"user network namespaces are not available here: {probe.stderr.decode().strip()}")
    setup = f'ip link set lo up && ip addr add {PUBLIC}/32 dev lo && exec "$@"'
    return ["unshare", "-rn", "sh", "-c", setup, "sh"]


def test_every_redirect_hop_is_checked_before_connecting() -> None:
    argv = [*_namespace_argv(), sys.executable, "-c", _SCRIPT, PUBLIC, png(4, 4).hex(), SECRET.decode()]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # the control: a public address is fetched, directly and through a redirect
    assert got.pop("public-direct") == "fetched" and got.pop("public-redirect") == "fetched"
    for name, outcome in got.items():
        assert outcome.startswith("image_url_not_allowed: "), f"{name}: {outcome}"
        assert "SECRET" not in outcome and "root" not in outcome, f"{name} quoted the private answer"


@pytest.mark.parametrize(
    "host",
    ["64:ff9b::7f00:1", "2002:7f00:1::", "::127.0.0.1", "2001:0:4136:e378:8000:63bf:80ff:fffe", "100.64.0.1"],
    ids=["nat64", "6to4", "v4-compatible", "teredo", "shared-cgnat"],
)
def test_ipv4_inside_ipv6_is_judged_by_the_ipv4(host: str) -> None:
    assert private_address(host)
