"""The images of a chat request, checked before any engine sees them.

Every surface's translator puts images into the OpenAI chat body as `image_url` parts; this module checks
each one there: a `data:` URL is decoded and inspected (app/server/gateway/image_check.py); an http(s) URL is
fetched only when the `fetch_image_urls` setting is on, with a size cap, a timeout, and never from a
loopback, private or link-local address unless `fetch_image_private` allows it (checked on every address
the name resolves to, redirects included). A fetched image (and any WebP) is put back as a `data:` URL,
so the engine never fetches anything itself. A model without a vision projector is refused before its
lane starts, and the images' tokens are counted against the lane's per-request context.

Every image's declared size (every frame, GIF's logical screen) is checked against a pixel budget for the
image and one for the whole request before anything is decoded, and the decoding runs in a thread, so a
decompression bomb neither reaches the engine nor stalls the event loop. A redirect is followed by hand,
one hop at a time, and each hop's host is checked before it is connected to: an IP literal here (in any
form the connector accepts, IPv4 inside IPv6 included), a name by the resolver on every address it
returns. Fetched bytes are never quoted back in an error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from yarl import URL

from app.core.errors import (
    BadRequestError,
    ImageFetchError,
    ImageTooLargeError,
    ImageURLRefusedError,
    InvalidImageError,
    ModelHasNoVisionError,
    TooManyImagesError,
    UnsupportedImageTypeError,
)
from app.core.netguard import GuardedResolver, literal_addresses
from app.core.settings import Settings
from app.fit.projector import image_tokens, vision_geometry
from app.library.model import ModelEntry
from app.library.pairing import vision_projector
from app.server.gateway.context_advice import more_context
from app.server.gateway.image_check import MEGA, TAKEN, ImageInfo, declared, verify, webp_as_png

MIB = 1 << 20
MAX_REDIRECTS = 3


@dataclass(frozen=True)
class ImagePolicy:
    max_bytes: int
    fetch_urls: bool
    allow_private: bool
    timeout_s: float
    max_pixels: int = 40 * MEGA  # one image (each frame, GIF's logical screen)
    max_request_pixels: int = 80 * MEGA  # all of one request's images

    @classmethod
    def of(cls, settings: Settings) -> ImagePolicy:
        return cls(
            max_pixels=settings.images.max_image_megapixels * MEGA,
            max_request_pixels=settings.images.max_request_megapixels * MEGA,
            max_bytes=settings.images.max_image_mib * MIB,
            fetch_urls=settings.images.fetch_image_urls,
            allow_private=settings.images.fetch_image_private,
            timeout_s=settings.images.fetch_image_timeout_s,
        )


@dataclass(frozen=True)
class ImagesSeen:
    count: int
    images: tuple[ImageInfo, ...]
    changed: bool  # a part was rewritten (a fetched URL or a WebP inlined): the body must be re-encoded


def image_parts(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, part) for every image part of an OpenAI chat body's messages."""
    out = []
    for i, m in enumerate(body.get("messages") or ()):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"):
                out.append((f"messages[{i}].content[{j}]", part))
    return out


async def prepare_images(body: dict[str, Any], *, policy: ImagePolicy, label: str = "") -> ImagesSeen:
    """Check every image part of `body` in place (fetched URLs and WebP become data: URLs). `label` maps
    the OpenAI part names onto the client's own field in messages ("images" for Ollama)."""
    seen: list[ImageInfo] = []
    changed = False
    for where, part in image_parts(body):
        name = label or where
        if part.get("type") != "image_url":
            raise BadRequestError(
                f"{name} has type {part.get('type')!r}; a chat message takes images as "
                '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}',
                param=name,
            )
        url = _url_of(part, name)
        data = None if url.startswith("data:") else await fetch_or_refuse(url, policy=policy, where=name)
        left = policy.max_request_pixels - sum(i.pixels for i in seen)
        # decoding is CPU work on up to max_image_mib of bytes: in a thread, never on the event loop
        info, inline = await asyncio.to_thread(
            _checked, url, data, policy=policy, where=name, request_left=left
        )
        if inline is not None:
            part["image_url"] = {"url": inline}
            changed = True
        seen.append(info)
    return ImagesSeen(len(seen), tuple(seen), changed)


def _checked(
    url: str, data: bytes | None, *, policy: ImagePolicy, where: str, request_left: int
) -> tuple[ImageInfo, str | None]:
    """(the image's type and size, the data: URL to put in its place or None to keep it): the declared
    sizes checked against both budgets, then the structure, then WebP re-encoded (runs in a thread)."""
    fetched = data is not None
    if data is None:
        data, _mime = decode_data_url(url, where=where, max_bytes=policy.max_bytes)
    info = declared(data, where=where, max_pixels=policy.max_pixels)
    if info.pixels > request_left:
        used = policy.max_request_pixels - request_left
        raise ImageTooLargeError(
            f"{where} declares {info.width}x{info.height} pixels, which with the request's earlier images "
            f"({used / MEGA:.1f} megapixels) passes the {policy.max_request_pixels / MEGA:g}-megapixel "
            "budget for one request (max_request_megapixels); send fewer or smaller images",
            param=where,
        )
    verify(data, info=info, where=where)
    mime = info.mime
    if mime == "image/webp":
        data, mime, fetched = webp_as_png(data, where=where), "image/png", True
    return info, (f"data:{mime};base64,{base64.b64encode(data).decode()}" if fetched else None)


def _url_of(part: dict[str, Any], where: str) -> str:
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise BadRequestError(f"{where}.image_url.url must be a data: or http(s) URL", param=where)
    return url


async def fetch_or_refuse(url: str, *, policy: ImagePolicy, where: str) -> bytes:
    """The bytes of an http(s) image URL, or why this server will not fetch it."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise BadRequestError(
            f"{where} has an image URL of scheme {scheme or '(none)'!r}; send a data:image/...;base64 URL",
            param=where,
        )
    if not policy.fetch_urls:
        raise ImageURLRefusedError(
            f"{where} is an {scheme} image URL, and this server does not fetch image URLs "
            "(the setting fetch_image_urls is off); send the image inline as a data:image/...;base64 URL, "
            "or turn fetch_image_urls on",
            param=where,
        )
    return await fetch_image(url, policy=policy, where=where)


def decode_data_url(url: str, *, where: str, max_bytes: int) -> tuple[bytes, str]:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise InvalidImageError(f"{where} must be a data:image/<type>;base64,<data> URL", param=where)
    mime = head[5:].split(";", 1)[0].strip().lower() or "application/octet-stream"
    if not mime.startswith("image/"):
        raise UnsupportedImageTypeError(
            f"{where} is a data URL of type {mime!r}; send a {TAKEN} image (data:image/png;base64,...)",
            param=where,
        )
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise _too_large(where, len(payload) * 3 // 4, max_bytes)
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImageError(
            f"{where} is not valid base64; encode the image file again", param=where
        ) from None
    if len(data) > max_bytes:
        raise _too_large(where, len(data), max_bytes)
    return data, mime


def _too_large(where: str, size: int, cap: int) -> ImageTooLargeError:
    return ImageTooLargeError(
        f"{where} is {size} bytes, over the {cap // MIB} MiB image cap (max_image_mib); send a smaller image",
        param=where,
    )


def private_address(host: str) -> bool:
    """Whether an address is one a server must not be made to fetch from: loopback, private, link-local,
    multicast, reserved, unspecified or otherwise not global, judged on the IPv4 address inside an IPv6
    one too (IPv4-mapped, IPv4-compatible, 6to4, Teredo, the NAT64 well-known prefix)."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    return any(
        a.is_loopback
        or a.is_private
        or a.is_link_local
        or a.is_multicast
        or a.is_reserved
        or a.is_unspecified
        or not a.is_global
        for a in (ip, inner)
        if a is not None
    )


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPAT = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def check_host(host: str, *, where: str) -> None:
    """ImageURLRefusedError for a URL host that is, or reads as, a private address: an IP literal as the
    connection will read it (app/core/netguard.py); a name is checked by `public_only` on every address it
    resolves to, when it is connected to."""
    if not host:
        raise ImageFetchError(f"{where}: the image URL has no host; check the URL", param=where)
    try:
        found = literal_addresses(host)
    except ValueError:
        raise ImageURLRefusedError(
            f"{where} names the host {host!r}, which is neither a name nor a plain IP address; check the URL",
            param=where,
        ) from None
    if found and any(private_address(a) for a in found):
        raise ImageURLRefusedError(
            f"{where} names the private or loopback address {host}; this server fetches images only "
            "from public addresses (the setting fetch_image_private allows others)",
            param=where,
        )


def _refuse_private(host: str, address: str) -> Exception | None:
    if not private_address(address):
        return None
    return ImageURLRefusedError(
        f"the image URL's host {host!r} is a private or loopback address ({address}); this server "
        "fetches images only from public addresses (the setting fetch_image_private allows others)"
    )


def public_only() -> AbstractResolver:
    """A resolver that refuses names with any private address, so neither a redirect nor a name that
    changes its answer reaches a private service."""
    return GuardedResolver(_refuse_private)


_REDIRECTS = frozenset({301, 302, 303, 307, 308})


async def fetch_image(url: str, *, policy: ImagePolicy, where: str) -> bytes:
    """GET an image URL with the cap and timeout, following at most MAX_REDIRECTS redirects by hand so
    that every hop's host is checked before it is connected to (unless private addresses are allowed)."""
    resolver: AbstractResolver = aiohttp.ThreadedResolver() if policy.allow_private else public_only()
    timeout = aiohttp.ClientTimeout(total=policy.timeout_s)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(resolver=resolver, force_close=True), timeout=timeout
        ) as http:
            async with asyncio.timeout(policy.timeout_s):  # the whole chain, not each hop
                return await _follow(http, URL(url), policy=policy, where=where)
    except ImageURLRefusedError as exc:
        exc.param = where
        raise
    except TimeoutError:
        raise ImageFetchError(
            f"{where}: {url} did not answer within {policy.timeout_s:g} s (fetch_image_timeout_s)",
            param=where,
        ) from None
    except aiohttp.ClientError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ImageURLRefusedError) else None
        if cause is not None:
            cause.param = where
            raise cause from None
        raise ImageFetchError(f"{where}: cannot fetch {url} ({exc}); check the URL", param=where) from None


async def _follow(http: aiohttp.ClientSession, url: URL, *, policy: ImagePolicy, where: str) -> bytes:
    for _hop in range(MAX_REDIRECTS + 1):
        if url.scheme not in ("http", "https"):
            raise ImageFetchError(f"{where}: the image URL redirects to a {url.scheme!r} URL", param=where)
        if not policy.allow_private:
            check_host(url.host or "", where=where)
        async with http.get(url, allow_redirects=False) as r:
            if r.status in _REDIRECTS and (location := r.headers.get("Location")):
                url = r.url.join(URL(location))
                continue
            if r.status != 200:
                raise ImageFetchError(f"{where}: {url} answered HTTP {r.status}; check the URL", param=where)
            return await _whole_body(r, max_bytes=policy.max_bytes, where=where)
    raise ImageFetchError(
        f"{where}: the image URL redirects more than {MAX_REDIRECTS} times; send the final URL", param=where
    )


async def _whole_body(r: aiohttp.ClientResponse, *, max_bytes: int, where: str) -> bytes:
    """The whole body, however many writes it came in, refused once it passes max_bytes."""
    declared_size = r.content_length
    if declared_size is not None and declared_size > max_bytes:
        raise _too_large(where, declared_size, max_bytes)
    data = bytearray()
    async for chunk in r.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > max_bytes:
            raise _too_large(where, len(data), max_bytes)
    return bytes(data)


def refuse_without_vision(model: str, *, has_projector: bool | None, where: str) -> None:
    """ModelHasNoVisionError for a local model known to have no projector (None: the engine decides)."""
    if has_projector is False:
        raise ModelHasNoVisionError(
            f"model {model!r} cannot read images: it has no vision projector (mmproj) beside it; send text "
            "only, or use a vision model (put its mmproj-*.gguf beside it, or name one in "
            f"model_overrides[{model!r}].mmproj)",
            param=where,
        )


async def check_request_images(
    body: dict[str, Any], *, model: str, entry: ModelEntry | None, settings: Settings, label: str = ""
) -> ImagesSeen:
    """The images of a chat body checked before the lane starts: a local llama.cpp model without a
    projector is refused, then every image is decoded and checked (see `prepare_images`)."""
    parts = image_parts(body)
    if not parts:
        return ImagesSeen(0, (), False)
    where = label or parts[0][0]
    if entry is not None and entry.format == "gguf" and entry.facts is not None:
        refuse_without_vision(model, has_projector=vision_projector(entry, settings) is not None, where=where)
    return await prepare_images(body, policy=ImagePolicy.of(settings), label=label)


def _projector_path(target: object) -> Path | None:
    """The projector a local llama.cpp lane was started with, else None."""
    plan = getattr(target, "plan", None)
    path = getattr(getattr(plan, "params", None), "mmproj_path", "") if plan is not None else ""
    return Path(path) if path else None


def tokens_per_image(target: object) -> int | None:
    """Tokens one image takes on a local llama.cpp lane whose projector fixes the count (llava's mlp/ldp,
    Gemma 3), else None (a dynamic-resolution projector: see `image_token_counts`)."""
    path = _projector_path(target)
    geometry = vision_geometry(path) if path is not None else None
    return image_tokens(geometry) if geometry is not None else None


def image_token_counts(body: dict[str, Any], target: object) -> list[int] | None:
    """Tokens each image of a (checked) chat body takes on a local llama.cpp lane, from its projector and
    each image's own size, as llama.cpp counts them: the dynamic-resolution projectors (Qwen-VL, Pixtral)
    included. None where a count is not known (no projector here, a projector type not counted, an image
    that is not a data: URL)."""
    path = _projector_path(target)
    geometry = vision_geometry(path) if path is not None else None
    if geometry is None:
        return None
    counts = []
    for where, part in image_parts(body):
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        size = None
        if isinstance(url, str) and url.startswith("data:"):
            try:
                data, _mime = decode_data_url(url, where=where, max_bytes=1 << 62)
                info = declared(data, where=where)  # headers only: the image was checked in full before
            except BadRequestError:
                return None
            size = (info.width, info.height)
        n = image_tokens(geometry, size)
        if n is None:
            return None
        counts.append(n)
    return counts


def check_image_tokens(
    n_images: int, per_image: int | Sequence[int] | None, *, slot: int, model: str, where: str
) -> int:
    """The images' tokens; TooManyImagesError, with the numbers, when they alone fill the context.
    `per_image`: one count for every image (a fixed-size projector) or each image's own count."""
    if not n_images or per_image is None:
        return 0
    counts = [per_image] * n_images if isinstance(per_image, int) else list(per_image)
    if not counts:
        return 0
    need = sum(counts)
    if need >= slot:
        each = f"{counts[0]} each" if len(set(counts)) == 1 else "by size: " + ", ".join(map(str, counts))
        fit, total = 0, 0
        for n in counts:
            if total + n >= slot:
                break
            fit, total = fit + 1, total + n
        raise TooManyImagesError(
            f"{len(counts)} image(s) take {need} tokens ({each}) on model {model!r}, but a request "
            f"has a context of {slot} tokens; send at most {fit} image(s) (or smaller ones), or "
            f"{more_context(model, parallel=None)}",
            param=where,
        )
    return need
