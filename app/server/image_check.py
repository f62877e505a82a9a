"""What an image's bytes are: its type and size in pixels, or why it is not a usable image.

llama.cpp decodes images leniently (a JPEG cut in half still "loads"), so every image is checked here
first, by its own structure, without an imaging library: PNG chunks walked with their CRCs and the pixel
data inflated to its exact size; JPEG segments walked to the frame header and the end marker; GIF's
screen, first image and trailer; WebP's RIFF container and bitstream header. WebP is checked, but the
engine cannot decode it: with Pillow installed it is re-encoded as PNG, else it is refused by name.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass

from app.core.errors import InvalidImageError, UnsupportedImageTypeError

PNG_SIG = b"\x89PNG\r\n\x1a\n"
MAX_SIDE = 16384  # pixels; a larger side is a corrupt header or a decompression bomb
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel
TAKEN = "png, jpeg, gif or webp"


@dataclass(frozen=True)
class ImageInfo:
    mime: str  # image/png, image/jpeg, image/gif, image/webp
    width: int
    height: int


def inspect(data: bytes, *, where: str) -> ImageInfo:
    """The type and size of `data`; InvalidImageError for a corrupt or truncated image,
    UnsupportedImageTypeError for another kind of file. `where` names the part in messages."""
    if data.startswith(PNG_SIG):
        info = _png(data, where)
    elif data.startswith(b"\xff\xd8\xff"):
        info = _jpeg(data, where)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        info = _gif(data, where)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        info = _webp(data, where)
    else:
        raise UnsupportedImageTypeError(
            f"{where} is not a {TAKEN} image (it starts with {data[:8]!r}); convert it to png or jpeg",
            param=where,
        )
    if not (0 < info.width <= MAX_SIDE and 0 < info.height <= MAX_SIDE):
        raise InvalidImageError(
            f"{where} claims {info.width}x{info.height} pixels; send 1 to {MAX_SIDE} pixels a side",
            param=where,
        )
    return info


def _broken(where: str, what: str) -> InvalidImageError:
    return InvalidImageError(
        f"{where} is not a readable image: {what}; send the whole file again", param=where
    )


def _png(data: bytes, where: str) -> ImageInfo:
    pos, width, height, idat, ended = 8, 0, 0, [], False
    depth = ctype = interlace = 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise _broken(where, f"the PNG is truncated inside its {kind.decode('latin-1')} chunk")
        body = data[pos + 8 : pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[end - 4 : end])[0]:
            raise _broken(where, f"the PNG's {kind.decode('latin-1')} chunk fails its checksum")
        if kind == b"IHDR" and length >= 13:
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body[:13])
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            ended = True
            break
        pos = end
    if not width or not ended or not idat:
        raise _broken(where, "the PNG has no header, no pixel data or no end (it is truncated)")
    _png_pixels(b"".join(idat), width, height, depth, ctype, interlace, where)
    return ImageInfo("image/png", width, height)


def _png_pixels(packed: bytes, w: int, h: int, depth: int, ctype: int, interlace: int, where: str) -> None:
    """Inflate the pixel data, never past the size the header promises (a bomb stops there)."""
    if ctype not in _CHANNELS or depth not in (1, 2, 4, 8, 16) or w > MAX_SIDE or h > MAX_SIDE:
        raise _broken(where, "the PNG header is invalid")
    expected = h * (1 + (w * _CHANNELS[ctype] * depth + 7) // 8)
    inflater = zlib.decompressobj()
    try:
        got = len(inflater.decompress(packed, expected + 1))
    except zlib.error as exc:
        raise _broken(where, f"the PNG's pixel data does not inflate ({exc})") from None
    # interlaced images store each pass with its own filter bytes: more than `expected`, checked loosely
    if (interlace == 0 and got != expected) or (interlace and got < expected // 2):
        raise _broken(where, f"the PNG holds {got} bytes of pixels where {w}x{h} needs {expected}")


def _jpeg(data: bytes, where: str) -> ImageInfo:
    if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        raise _broken(where, "the JPEG has no end marker (it is truncated)")
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise _broken(where, "the JPEG's segments are corrupt")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return ImageInfo("image/jpeg", width, height)
        if marker == 0xDA:  # scan data before any frame header
            break
        pos += 2 + length
    raise _broken(where, "the JPEG has no frame header")


def _gif(data: bytes, where: str) -> ImageInfo:
    if len(data) < 13:
        raise _broken(where, "the GIF is truncated")
    width, height = struct.unpack("<HH", data[6:10])
    if b"\x2c" not in data[13:] or not data.endswith(b"\x3b"):
        raise _broken(where, "the GIF has no image or no trailer (it is truncated)")
    return ImageInfo("image/gif", width, height)


def _webp(data: bytes, where: str) -> ImageInfo:
    (riff,) = struct.unpack("<I", data[4:8])
    if riff + 8 > len(data) or len(data) < 30:
        raise _broken(where, "the WebP is truncated")
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return ImageInfo("image/webp", w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ImageInfo("image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return ImageInfo("image/webp", w, h)
    raise _broken(where, "the WebP bitstream header is not recognised")


def webp_as_png(data: bytes, *, where: str) -> bytes:
    """A WebP re-encoded as PNG (the engine reads no WebP), through Pillow when it is installed."""
    try:
        from PIL import Image  # type: ignore[import-not-found,unused-ignore]  # optional: only WebP needs it
    except ImportError:
        raise UnsupportedImageTypeError(
            f"{where} is a WebP image, which this server can only pass on with Pillow installed "
            "(pip install pillow); send png or jpeg instead",
            param=where,
        ) from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            out = io.BytesIO()
            im.convert("RGB").save(out, "PNG")
    except (OSError, ValueError) as exc:
        raise _broken(where, f"the WebP does not decode ({exc})") from None
    return out.getvalue()
