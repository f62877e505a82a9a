"""What an image's bytes are: its type and size in pixels, or why it is not a usable image.

llama.cpp decodes images leniently (a JPEG cut in half still "loads"), so every image is checked here
first, by its own structure, without an imaging library. The check runs in two steps: `declared` reads
only headers (PNG's IHDR; every JPEG frame header; GIF's logical screen and every frame's descriptor;
WebP's canvas and every animation frame) and refuses sizes over the pixel budget before anything is
inflated, so a small file that declares a huge picture (a decompression bomb) costs nothing; `verify`
then walks the rest: PNG chunks with their CRCs and the pixel data inflated in bounded steps to its exact
size, the JPEG end marker. WebP is checked, but the engine cannot decode it: with Pillow installed it is
re-encoded as PNG, else it is refused by name. These functions are CPU-bound: callers on an event loop
run them in a thread (app/server/gateway/images.py).
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass

from app.core.errors import ImageTooLargeError, InvalidImageError, UnsupportedImageTypeError

PNG_SIG = b"\x89PNG\r\n\x1a\n"
MAX_SIDE = 16384  # pixels; a larger side is a corrupt header or a decompression bomb
MEGA = 1_000_000
NO_BUDGET = MAX_SIDE * MAX_SIDE  # for reading sizes only (token counts), never for letting an image through
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_INFLATE_STEP = 1 << 20  # bytes of pixels held at once while a PNG is inflated
TAKEN = "png, jpeg, gif or webp"


@dataclass(frozen=True)
class ImageInfo:
    mime: str  # image/png, image/jpeg, image/gif, image/webp
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def inspect(data: bytes, *, where: str, max_pixels: int = NO_BUDGET) -> ImageInfo:
    """The type and size of `data`, its declared sizes checked against `max_pixels` before it is decoded;
    InvalidImageError for a corrupt or truncated image, ImageTooLargeError over the budget,
    UnsupportedImageTypeError for another kind of file. `where` names the part in messages."""
    info = declared(data, where=where, max_pixels=max_pixels)
    verify(data, info=info, where=where)
    return info


def declared(data: bytes, *, where: str, max_pixels: int = NO_BUDGET) -> ImageInfo:
    """The type and size the headers declare, every declared size (frames included) within `max_pixels`
    and MAX_SIDE; nothing is inflated or decoded."""
    if data.startswith(PNG_SIG):
        return _png_header(data, where, max_pixels)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg(data, where, max_pixels)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data, where, max_pixels)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data, where, max_pixels)
    # the bytes themselves are never quoted: they may be a private service's answer (a fetched URL)
    raise UnsupportedImageTypeError(
        f"{where} is not a {TAKEN} image (its first bytes match none of them); convert it to png or jpeg",
        param=where,
    )


def verify(data: bytes, *, info: ImageInfo, where: str) -> None:
    """The rest of an image `declared` accepted: PNG chunks and pixels; JPEG and GIF decoded whole, as
    their structure alone cannot show damaged compressed data (the engine would read garbage silently)."""
    if info.mime == "image/png":
        _png_body(data, where)
    elif info.mime == "image/jpeg" and not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        raise _broken(where, "the JPEG has no end marker (it is truncated)")
    elif info.mime in ("image/jpeg", "image/gif"):
        _decodes(data, where, kind=info.mime.removeprefix("image/").upper())


def _decodes(data: bytes, where: str, *, kind: str) -> None:
    """Decode every frame with Pillow (a core dependency); `declared` has bounded the pixels already."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            for frame in range(getattr(im, "n_frames", 1)):
                im.seek(frame)
                im.load()
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # Pillow's kinds of undecodable data
        if kind == "GIF" and str(exc).startswith("image file is truncated"):
            return  # a frame's pixel data ending early (its blocks are whole): decoders fill the rest
        raise _broken(where, f"the {kind}'s compressed data does not decode ({exc})") from None


def over_budget(where: str, *, width: int, height: int, budget: int, what: str = "") -> ImageTooLargeError:
    return ImageTooLargeError(
        f"{where} declares {width}x{height} pixels{what} ({width * height / MEGA:.1f} megapixels), over the "
        f"{budget / MEGA:g}-megapixel budget for one image (max_image_megapixels); send a smaller image",
        param=where,
    )


def _size(where: str, width: int, height: int, budget: int, what: str = "") -> None:
    if width <= 0 or height <= 0:
        raise InvalidImageError(
            f"{where} claims {width}x{height} pixels{what}, which no image has; send the whole file again",
            param=where,
        )
    if width > MAX_SIDE or height > MAX_SIDE:  # a real picture this large is too large, not corrupt
        raise ImageTooLargeError(
            f"{where} is {width}x{height} pixels{what}, over the {MAX_SIDE}-pixel side this server takes; "
            f"scale it down to at most {MAX_SIDE} pixels a side",
            param=where,
        )
    if width * height > budget:
        raise over_budget(where, width=width, height=height, budget=budget, what=what)


def _broken(where: str, what: str) -> InvalidImageError:
    return InvalidImageError(
        f"{where} is not a readable image: {what}; send the whole file again", param=where
    )


def _png_header(data: bytes, where: str, budget: int) -> ImageInfo:
    if len(data) < 33 or data[12:16] != b"IHDR" or struct.unpack(">I", data[8:12])[0] != 13:
        raise _broken(where, "the PNG does not start with its header chunk (IHDR)")
    width, height, depth, ctype = struct.unpack(">IIBB", data[16:26])
    if ctype not in _CHANNELS or depth not in (1, 2, 4, 8, 16):
        raise _broken(where, "the PNG header is invalid")
    _size(where, width, height, budget)
    return ImageInfo("image/png", width, height)


def _png_body(data: bytes, where: str) -> None:
    pos, idat, ended = 8, [], False
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise _broken(where, f"the PNG is truncated inside its {kind.decode('latin-1')} chunk")
        body = data[pos + 8 : pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[end - 4 : end])[0]:
            raise _broken(where, f"the PNG's {kind.decode('latin-1')} chunk fails its checksum")
        if kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            ended = True
            break
        pos = end
    if not ended or not idat:
        raise _broken(where, "the PNG has no pixel data or no end (it is truncated)")
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    bits = _CHANNELS[ctype] * depth
    expected = _png_size(width, height, bits, interlace)
    got = _inflated_size(b"".join(idat), limit=expected, where=where)
    if got != expected:
        raise _broken(where, f"the PNG holds {got} bytes of pixels where {width}x{height} needs {expected}")


def _png_size(w: int, h: int, bits: int, interlace: int) -> int:
    """Bytes of filtered pixel data a PNG of this header holds (each Adam7 pass with its own rows)."""
    if not interlace:
        return h * (1 + (w * bits + 7) // 8)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        pw, ph = (w - x0 + dx - 1) // dx, (h - y0 + dy - 1) // dy
        if pw > 0 and ph > 0:
            total += ph * (1 + (pw * bits + 7) // 8)
    return total


def _inflated_size(packed: bytes, *, limit: int, where: str) -> int:
    """How many bytes `packed` inflates to, counted in steps of _INFLATE_STEP and never past limit + 1,
    so memory stays bounded whatever the stream claims."""
    inflater = zlib.decompressobj()
    got, rest = 0, packed
    try:
        while got <= limit:
            out = inflater.decompress(rest, min(_INFLATE_STEP, limit + 1 - got))
            rest = inflater.unconsumed_tail
            got += len(out)
            if not out:
                break
    except zlib.error as exc:
        raise _broken(where, f"the PNG's pixel data does not inflate ({exc})") from None
    return got


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(data: bytes, where: str, budget: int) -> ImageInfo:
    """Every frame header before the first scan, each checked (a later one could declare a larger frame)."""
    pos, first = 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise _broken(where, "the JPEG's segments are corrupt")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:  # the first scan: the frame headers are all read
            break
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in _SOF:
            if pos + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            _size(where, width, height, budget)
            first = first or ImageInfo("image/jpeg", width, height)
        pos += 2 + length
    if first is None:
        raise _broken(where, "the JPEG has no frame header")
    return first


def _gif(data: bytes, where: str, budget: int) -> ImageInfo:
    """The logical screen (what a decoder allocates) and every frame's descriptor, each inside it."""
    if len(data) < 13:
        raise _broken(where, "the GIF is truncated")
    width, height, flags = struct.unpack("<HHB", data[6:11])
    _size(where, width, height, budget, " (its logical screen)")
    pos, frames = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0), 0
    while pos < len(data):
        block = data[pos]
        if block == 0x3B:  # trailer
            if not frames:
                raise _broken(where, "the GIF has no image")
            return ImageInfo("image/gif", width, height)
        if block == 0x21:  # extension: label, then data sub-blocks
            pos = _gif_sub_blocks(data, pos + 2, where)
        elif block == 0x2C:  # image descriptor, optional local colour table, LZW code size, sub-blocks
            if pos + 10 > len(data):
                break
            left, top, w, h, local = struct.unpack("<HHHHB", data[pos + 1 : pos + 10])
            frames += 1
            _size(where, w, h, budget, f" (frame {frames})")
            if left + w > width or top + h > height:
                raise _broken(where, f"the GIF's frame {frames} lies outside its logical screen")
            pos += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0)
            pos = _gif_sub_blocks(data, pos + 1, where)
        else:
            raise _broken(where, "the GIF's blocks are corrupt")
    raise _broken(where, "the GIF has no trailer (it is truncated)")


def _gif_sub_blocks(data: bytes, pos: int, where: str) -> int:
    """The position after a chain of GIF data sub-blocks starting at `pos`."""
    while pos < len(data):
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos
    raise _broken(where, "the GIF is truncated inside a block")


def _webp(data: bytes, where: str, budget: int) -> ImageInfo:
    (riff,) = struct.unpack("<I", data[4:8])
    if riff + 8 > len(data) or len(data) < 30:
        raise _broken(where, "the WebP is truncated")
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        info = ImageInfo("image/webp", w & 0x3FFF, h & 0x3FFF)
    elif chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        info = ImageInfo("image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    elif chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        info = ImageInfo("image/webp", w, h)
        _webp_frames(data, where, budget)
    else:
        raise _broken(where, "the WebP bitstream header is not recognised")
    _size(where, info.width, info.height, budget)
    return info


def _webp_frames(data: bytes, where: str, budget: int) -> None:
    """Every animation frame (ANMF) of an extended WebP within the budget."""
    pos, n = 12, 0
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        if kind == b"ANMF" and pos + 20 <= len(data):
            n += 1
            w = int.from_bytes(data[pos + 14 : pos + 17], "little") + 1
            h = int.from_bytes(data[pos + 17 : pos + 20], "little") + 1
            _size(where, w, h, budget, f" (frame {n})")
        pos += 8 + size + (size & 1)


def webp_as_png(data: bytes, *, where: str) -> bytes:
    """A WebP re-encoded as PNG (the engine reads no WebP), through Pillow when it is installed. Call it
    only on an image `declared` accepted: its size is then within the budget."""
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
