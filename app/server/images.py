"""The images of a chat request, checked before any engine sees them.

Every surface's translator puts images into the OpenAI chat body as `image_url` parts; this module checks
each one there: a `data:` URL is decoded and inspected (app/server/image_check.py); an http(s) URL is
fetched only when the `fetch_image_urls` setting is on, with a size cap, a timeout, and never from a
loopback, private or link-local address unless `fetch_image_private` allows it (checked on every address
the name resolves to, redirects included). A fetched image (and any WebP) is put back as a `data:` URL,
so the engine never fetches anything itself. A model without a vision projector is refused before its
lane starts, and the images' tokens are counted against the lane's per-request context.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

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
from app.core.settings import Settings
from app.fit.projector import image_tokens, vision_geometry
from app.library.model import ModelEntry
from app.library.pairing import vision_projector
from app.server.image_check import TAKEN, ImageInfo, inspect, webp_as_png

MIB = 1 << 20
MAX_REDIRECTS = 3


@dataclass(frozen=True)
class ImagePolicy:
    max_bytes: int
    fetch_urls: bool
    allow_private: bool
    timeout_s: float

    @classmethod
    def of(cls, settings: Settings) -> ImagePolicy:
        return cls(
            max_bytes=settings.max_image_mib * MIB,
            fetch_urls=settings.fetch_image_urls,
            allow_private=settings.fetch_image_private,
            timeout_s=settings.fetch_image_timeout_s,
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
        data, mime, fetched = await _image_bytes(url, policy=policy, where=name)
        info = inspect(data, where=name)
        if info.mime == "image/webp":
            data, fetched = webp_as_png(data, where=name), True
            mime = "image/png"
        if fetched:
            part["image_url"] = {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
            changed = True
        seen.append(info)
    return ImagesSeen(len(seen), tuple(seen), changed)


def _url_of(part: dict[str, Any], where: str) -> str:
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise BadRequestError(f"{where}.image_url.url must be a data: or http(s) URL", param=where)
    return url


async def _image_bytes(url: str, *, policy: ImagePolicy, where: str) -> tuple[bytes, str, bool]:
    """(bytes, mime type, whether they came from the network)."""
    if url.startswith("data:"):
        data, mime = decode_data_url(url, where=where, max_bytes=policy.max_bytes)
        return data, mime, False
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
    data, mime = await fetch_image(url, policy=policy, where=where)
    return data, mime, True


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
    multicast, reserved or unspecified (IPv4 inside IPv6 included)."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def _literal_private(host: str) -> bool:
    """Whether `host` is an IP literal of a private address (a name is checked by the resolver)."""
    try:
        return private_address(host)
    except ValueError:
        return False


class PublicOnlyResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver and refuses names with any private address, so neither
    a redirect nor a name that changes its answer reaches a private service."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        bad = [r["host"] for r in found if private_address(r["host"])]
        if bad:
            raise ImageURLRefusedError(
                f"the image URL's host {host!r} is a private or loopback address ({bad[0]}); this server "
                "fetches images only from public addresses (the setting fetch_image_private allows others)"
            )
        return found

    async def close(self) -> None:
        await self._inner.close()


async def fetch_image(url: str, *, policy: ImagePolicy, where: str) -> tuple[bytes, str]:
    """GET an image URL with the cap and timeout; refused for a private address unless allowed."""
    host = urlsplit(url).hostname or ""
    if not policy.allow_private and _literal_private(host):
        raise ImageURLRefusedError(
            f"{where} names the private or loopback address {host}; this server fetches images only "
            "from public addresses (the setting fetch_image_private allows others)",
            param=where,
        )
    resolver: AbstractResolver = aiohttp.ThreadedResolver() if policy.allow_private else PublicOnlyResolver()
    timeout = aiohttp.ClientTimeout(total=policy.timeout_s)
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver), timeout=timeout) as http,
            http.get(url, max_redirects=MAX_REDIRECTS) as r,
        ):
            if r.status != 200:
                raise ImageFetchError(f"{where}: {url} answered HTTP {r.status}; check the URL", param=where)
            declared = r.content_length
            if declared is not None and declared > policy.max_bytes:
                raise _too_large(where, declared, policy.max_bytes)
            data = await r.content.read(policy.max_bytes + 1)
            if len(data) > policy.max_bytes:
                raise _too_large(where, len(data), policy.max_bytes)
            return data, (r.content_type or "image/png").lower()
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
                info = inspect(data, where=where)
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
            f"raise ctx_size or lower parallel (model_overrides[{model!r}] in settings.json)",
            param=where,
        )
    return need
